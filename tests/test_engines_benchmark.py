"""benchmarks.engines' report logic: the launcher's progress lines read, the collective cases'
sizes, medians and TF / Horovod ratios, and the Markdown tables. Nothing is launched or timed
(no TensorFlow in this process)."""

import json

import pytest

from benchmarks import engines

PREFIXED = ("[0]<stdout>:epoch 1 batch 11/21 step 11: loss 0.5012, auc 0.6123, 43,690 "
            "examples/s, 187.5 ms/step")


def test_a_progress_line_gives_its_step_and_ms_per_step():
    assert engines.parse_step_line(PREFIXED) == (11, 187.5)
    assert engines.parse_step_line("epoch 2 batch 3 step 24: loss 0.4, 1,234 examples/s, "
                                   "1234.0 ms/step\n") == (24, 1234.0)


@pytest.mark.parametrize("line", [
    "[0]<stdout>:model deepfm (123 parameters) on synthetic data; batch 8192",
    "[1]<stderr>:I0000 port.cc:153] oneDNN custom operations are on.",
    "epoch 1/1: test AUC 0.7412, logloss 0.4893",
    ""])
def test_other_lines_are_not_progress_lines(line):
    assert engines.parse_step_line(line) is None


def test_the_first_progress_line_is_left_out():
    lines = ["[0]<stdout>:model deepfm (1 parameters) ...",
             "[0]<stdout>:epoch 1 batch 6/21 step 6: loss 0.6, 1 examples/s, 900.0 ms/step",
             "[1]<stderr>:noise",
             "[0]<stdout>:epoch 1 batch 11/21 step 11: loss 0.5, 1 examples/s, 200.5 ms/step",
             "[0]<stdout>:epoch 1 batch 16/21 step 16: loss 0.5, 1 examples/s, 210.0 ms/step"]
    assert engines.step_times(lines) == [200.5, 210.0]
    assert engines.step_times(lines[:2]) == []


def test_the_launchers_description_is_found_under_either_prefix():
    lines = ["[1]<stderr>:warning", "[0]<stdout>:model deepfm (9 parameters) on data; 2 ranks "
             "(tf engine) at batch 512 each"]
    assert engines.model_line(lines).endswith("(tf engine) at batch 512 each")
    assert engines.model_line(["model dcn (1 parameters) x"]) == "model dcn (1 parameters) x"
    assert engines.model_line(["nothing"]) == ""


def test_collective_records_are_read_from_every_rank():
    record = {"engine_collective": True, "rank": 1, "op": "allreduce", "median_ms": 2.5}
    lines = ["[1]<stdout>:engine_collective " + json.dumps(record), "[0]<stdout>:other"]
    assert engines.collective_records(lines) == [record]


@pytest.mark.parametrize("size", [2, 4])
def test_unequal_sizes_hold_the_same_total_as_their_equal_counterpart(size):
    equal = engines.per_rank_rows(16, size, "equal")
    uneven = engines.per_rank_rows(16, size, "uneven")
    mean = engines.per_rank_rows(16, size, "equal_mean")
    assert equal == [16 * 1024] * size
    assert uneven[-1] == equal[0] and uneven == sorted(uneven)
    assert sum(mean) == sum(uneven)
    assert all(count % size == 0 for count in equal + uneven + mean)


def test_tiny_sizes_still_split_equally():
    assert engines.per_rank_rows(0.001, 4, "uneven") == [4, 4, 4, 4]
    with pytest.raises(ValueError):
        engines.per_rank_rows(1, 2, "ragged")


def test_padding_moves_the_largest_ranks_rows_from_every_rank():
    assert engines.padding_factor([512, 1024]) == pytest.approx(4 / 3)
    assert engines.padding_factor([256, 512, 768, 1024]) == pytest.approx(1.6)
    assert engines.padding_factor([8, 8]) == 1.0


def _runs(horovod, tf):
    return ([{"engine": "horovod", "round": i, "median_ms": v} for i, v in enumerate(horovod)]
            + [{"engine": "tf", "round": i, "median_ms": v} for i, v in enumerate(tf)])


def test_the_ratio_is_of_the_medians_with_the_range_of_the_rounds():
    compared = engines.compare(_runs([10.0, 20.0, 12.0], [15.0, 20.0, 24.0]))
    assert compared["horovod"] == 12.0 and compared["tf"] == 20.0
    assert compared["ratio"] == pytest.approx(20 / 12)
    assert compared["range"] == pytest.approx((1.0, 2.0))
    assert engines.ratio_text(compared) == "1.67 (1.00-2.00)"


def test_one_round_or_one_engine():
    assert engines.ratio_text(engines.compare(_runs([10.0], [12.5]))) == "1.25"
    missing = engines.compare(_runs([10.0], []))
    assert missing["tf"] is None and missing["ratio"] is None
    assert engines.ratio_text(missing) == ""


def test_milliseconds_are_shown_to_three_figures_or_so():
    assert engines.ms(None) == ""
    assert engines.ms(3.14159) == "3.14"
    assert engines.ms(1234.56) == "1,234.6"


def test_step_cases_and_launcher_arguments():
    assert engines.parse_step_cases(["2x8192", "4x65536"]) == [(2, 8192), (4, 65536)]
    replicated = engines.step_arguments(8192, "replicated", 21, 5)
    assert "--train_rows=172032" in replicated and "--log_every_steps=5" in replicated
    assert not any(a.startswith("--embedding_sharding") for a in replicated)
    assert engines.step_arguments(8192, "row", 21, 5)[-1] == "--embedding_sharding=row"


def test_each_engine_has_its_launcher():
    horovod = engines.launch_command("horovod", 4, "launch.train", ["--epochs=1"])
    assert horovod[0].endswith("horovodrun")
    assert horovod[1:6] == ["-np", "4", "-H", "localhost:4", "--gloo"]
    assert horovod[-3:] == ["-m", "launch.train", "--epochs=1"]
    tf = engines.launch_command("tf", 2, "benchmarks.engine_collectives", [])
    assert tf[1:7] == ["-m", "tfscale.run", "-np", "2", "-m", "benchmarks.engine_collectives"]


def _context(run_id):
    return {"run_id": run_id, "date": run_id[:10], "commit": "abc1234",
            "command": "python -m benchmarks.engines", "note": "",
            "machine": {"cpu": "AMD EPYC", "cores": 2, "cpu_flags": "fpu sse avx avx2 fma"},
            "versions": {"python": "3.11.7", "tensorflow": "2.21.0", "keras": "3.15.1",
                         "horovod": "0.28.1"},
            "loadavg_1min_before_after": [0.5, 1.0], "other_processes_cpu_seconds": 3.0}


def _collective(run_id, engine, round_index, op, variant, megabytes, median_ms, ranks=2):
    rows = engines.per_rank_rows(megabytes, ranks, variant if variant in (
        "equal", "uneven", "equal_mean") else "equal") if megabytes else [1] * ranks
    return dict(_context(run_id), kind="collective", engine=engine, ranks=ranks,
                round=round_index, op=op, variant=variant, megabytes=megabytes,
                rows_per_rank=rows, row_bytes=1024 if megabytes else 4, median_ms=median_ms)


def _steps(run_id, engine, round_index, median_ms, sharding="replicated"):
    return dict(_context(run_id), kind="steps", engine=engine, ranks=2, round=round_index,
                batch_size=8192, sharding=sharding, steps=21, log_every_steps=5,
                step_ms=[median_ms] * 3, median_ms=median_ms, model="model deepfm")


def _row(markdown, *starts):
    found = [line for line in markdown.splitlines()
             if line.startswith("| " + " | ".join(starts) + " |")]
    assert len(found) == 1, (starts, found)
    return [cell.strip() for cell in found[0].strip("|").split("|")]


def test_the_report_compares_the_latest_run_side_by_side():
    old, new = "2026-12-01T10:00:00", "2026-12-02T10:00:00"
    records = [_collective(old, "horovod", 0, "allreduce", "equal", 16, 100.0),
               _collective(old, "tf", 0, "allreduce", "equal", 16, 900.0)]
    for round_index, (h, t) in enumerate([(10.0, 20.0), (12.0, 18.0)]):
        records += [_collective(new, "horovod", round_index, "allreduce", "equal", 16, h),
                    _collective(new, "tf", round_index, "allreduce", "equal", 16, t)]
    records += [_collective(new, "horovod", 0, "allgather", "uneven", 16, 10.0),
                _collective(new, "tf", 0, "allgather", "uneven", 16, 30.0),
                _collective(new, "horovod", 0, "allgather", "equal_mean", 16, 8.0),
                _collective(new, "tf", 0, "allgather", "equal_mean", 16, 20.0),
                _collective(new, "horovod", 0, "allgather", "equal", 16, 8.0),
                _collective(new, "tf", 0, "allgather", "equal", 16, 24.0),
                _collective(new, "tf", 0, "allgather", "runtime", 16, 16.0),
                _collective(new, "horovod", 0, "allreduce", "4B", 0, 1.0),
                _collective(new, "tf", 0, "allreduce", "4B", 0, 2.0),
                _collective(new, "tf", 0, "allgather", "4B_runtime", 0, 1.5),
                _steps(new, "horovod", 0, 200.0), _steps(new, "tf", 0, 300.0),
                _steps(new, "horovod", 1, 220.0), _steps(new, "tf", 1, 310.0)]
    markdown = engines.report_markdown(records)
    # The old run's allreduce (9x) is replaced by the new one's two rounds.
    assert _row(markdown, "2", "allreduce", "16") == [
        "2", "allreduce", "16", "11.0", "19.0", "1.73 (1.50-2.00)", "(same)", ""]
    assert _row(markdown, "2", "allgather", "16", "8.00") == [
        "2", "allgather", "16", "8.00", "24.0", "3.00", "16.0", "2.00"]
    assert _row(markdown, "2", "allgather", "16", "1.33") == [
        "2", "allgather", "16", "1.33", "30.0", "20.0", "1.50", "10.0", "8.00", "1.25",
        "3.00"]
    assert _row(markdown, "2", "allreduce of one float32")[2:] == ["1.00", "2.00", "2.00"]
    assert "(the engine's size agreement) | | 1.50 |" in markdown
    assert _row(markdown, "2", "8,192", "replicated") == [
        "2", "8,192", "replicated", "210.0", "305.0", "1.45 (1.41-1.50)", "2", "about 15"]
    # The runs the tables use are named, with the machine and its vector flags; the old run
    # no longer is.
    assert f"run {new}" in markdown and f"run {old}" not in markdown
    records += [_collective(old, "horovod", 0, "alltoall", "equal", 16, 5.0),
                _collective(old, "tf", 0, "alltoall", "equal", 16, 6.0)]
    markdown = engines.report_markdown(records)
    assert f"run {old}" in markdown and _row(markdown, "2", "alltoall", "16")[5] == "1.20"
    assert "AMD EPYC, 2 cores (lscpu flags: avx avx2 fma)" in markdown


def test_the_report_of_one_part_only():
    markdown = engines.report_markdown([_steps("2026-12-02T10:00:00", "horovod", 0, 100.0)])
    assert "## Collectives" not in markdown
    assert _row(markdown, "2", "8,192", "replicated")[3:6] == ["100.0", "", ""]


def test_vector_flags_keep_avx_amx_and_fma():
    assert engines.vector_flags("fpu sse2 avx avx512f amx_tile fma pdpe1gb") == (
        "avx avx512f amx_tile fma")
