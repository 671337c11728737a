"""The two ways to give a user's files embedding tables, side by side on files made here:

    python -m benchmarks.file_tables --data_dir=/tmp/file_tables --rows=600000 --epochs=3 \\
        --rounds=2 --note="what else ran"
    python -m benchmarks.file_tables --report

  vocabulary  the launcher's default: a vocabulary pass over the training lines (values seen at
              least --vocabulary_min_count times; counted afresh each run, the cache removed),
              then fixed tables sized from it, replicated;
  dynamic     no pass: every value keyed by its 56-bit fingerprint
              (--categorical_encoding=fingerprint), rows handed out as ids arrive
              (--embedding_sharding=dynamic), capacity from the file size;
  dynamic_min_count_10  the same, a value getting a row of its own once seen 10 times (as the
              vocabulary's default min count; until then its field's unknown row).

The files, Criteo format (label, 13 integers, 26 categorical values):
  long_tailed  SyntheticCTR's rows (Zipf-drawn ids of Criteo's cardinalities / 20, a planted
               teacher model): train rows [0, rows), test rows [rows, rows + rows / 6);
  drifting     DriftingCTR's days (ids born and fading, half-life 7 days) as hexadecimal ids: the
               first three days in three training files, the fourth day the test file.

Every run is `python -m launch.train` in a process of its own (settings alternate within a
round, the first one alternating between rounds), timed from its start to its first training
step's end (a progress line every step, the first after the second step: its time less that
step's) and to its exit, with its peak resident memory
(ru_maxrss) and each epoch's test AUC and logloss. One JSON line per run is appended to
--results with the machine (lscpu model name and flags, cores), the date, the command and the
1-minute load average before and after."""

import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", "/tmp/file_tables", "Where the files are written (once).")
flags.DEFINE_integer("rows", 600_000, "Training rows of each kind of file.")
flags.DEFINE_integer("epochs", 3, "Epochs of every run.")
flags.DEFINE_integer("batch_size", 4096, "Batch size of every run.")
flags.DEFINE_integer("rounds", 1, "Rounds of every (file, setting).")
flags.DEFINE_list("files", ["long_tailed", "drifting"], "Kinds of file.")
flags.DEFINE_list("settings", ["vocabulary", "dynamic"], "Settings compared.")
flags.DEFINE_string("results", "benchmarks/results/file_tables.jsonl", "JSON lines file.")
flags.DEFINE_string("note", "", "What else ran on the machine (stored with each line).")
flags.DEFINE_bool("report", False, "Only print the table of --results.")

SETTINGS = {
    "vocabulary": [],
    "dynamic": ["--embedding_sharding=dynamic", "--categorical_encoding=fingerprint"],
    "dynamic_min_count_10": ["--embedding_sharding=dynamic", "--categorical_encoding=fingerprint",
                             "--dynamic_min_count=10"],
}
COMMON_FLAGS = ["--data=criteo", "--logdir=none", "--checkpoint_dir=none", "--log_every_steps=1"]
DRIFTING_DAYS = 4  # three training days, then the test day


def write_files(data_dir, rows):
    """{kind: (train paths, test path)}, written unless already there."""
    os.makedirs(data_dir, exist_ok=True)
    files = {
        "long_tailed": ([f"{data_dir}/long_tailed_train.txt"], f"{data_dir}/long_tailed_test.txt"),
        "drifting": ([f"{data_dir}/drifting_day{day}.txt" for day in (1, 2, 3)],
                     f"{data_dir}/drifting_day4.txt"),
    }
    if all(os.path.exists(path) for train, test in files.values() for path in train + [test]):
        return files
    from tfscale.data.drifting import DriftingCTR
    from tfscale.data.synthetic import SyntheticCTR

    test_rows = rows // 6
    synthetic = SyntheticCTR(seed=11, train_rows=rows, test_rows=test_rows)
    synthetic.write_criteo_tsv(files["long_tailed"][0][0], 0, rows)
    synthetic.write_criteo_tsv(files["long_tailed"][1], rows, test_rows)
    per_day = rows // 3
    drifting = DriftingCTR(seed=11, days=DRIFTING_DAYS, rows_per_day=per_day)
    day_paths = files["drifting"][0] + [files["drifting"][1]]
    for day, path in enumerate(day_paths):
        write_day(drifting, day, path, per_day if day < 3 else test_rows)
    return files


def write_day(stream, day, path, rows):
    """Rows [0, rows) of `day` of a DriftingCTR as Criteo lines, ids as hexadecimal strings."""
    import numpy as np

    keys = ("dense_raw", "dense_present", "categorical", "label")
    with open(path, "w") as out:
        for chunk in stream.rows(day, 0, rows, 65536, keys=keys):
            values = {key: value.numpy() for key, value in chunk.items()}
            columns = [values["label"].astype(np.int64).astype(str)]
            for j in range(values["dense_raw"].shape[1]):
                columns.append(np.where(values["dense_present"][:, j],
                                        values["dense_raw"][:, j].astype(np.int64).astype(str), ""))
            for f in range(values["categorical"].shape[1]):
                ids = values["categorical"][:, f]
                columns.append(np.where(ids == 0, "", np.char.mod("%x", ids)))
            out.write("".join("\t".join(line) + "\n" for line in zip(*columns)))


def remove_vocabulary_caches(train_paths):
    from tfscale.data.text_lines import VOCABULARY_CACHE_MARK

    directory = os.path.dirname(train_paths[0])
    for name in os.listdir(directory):
        if VOCABULARY_CACHE_MARK in name:
            os.remove(os.path.join(directory, name))


def run(kind, setting, train_paths, test_path):
    """One launch.train run: its measurements."""
    remove_vocabulary_caches(train_paths)
    command = [sys.executable, "-m", "launch.train", *COMMON_FLAGS, *SETTINGS[setting],
               f"--train_path={','.join(train_paths)}", f"--test_path={test_path}",
               f"--batch_size={FLAGS.batch_size}", f"--epochs={FLAGS.epochs}"]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    first_step, lines = None, []
    for line in process.stdout:
        lines.append(line)
        second = re.match(r"epoch 1 batch 2/\d+ step 2: .* ([\d.,]+) ms/step", line)
        if first_step is None and second:  # the first progress line is the second step's
            first_step = time.monotonic() - started - float(second.group(1)) / 1e3
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - started
    output = "".join(lines)
    if status != 0:
        raise SystemExit(f"{kind} {setting} failed:\n{output[-3000:]}\n{stderr[-3000:]}")
    epochs = [{"auc": float(auc), "logloss": float(loss)} for auc, loss in re.findall(
        r"^epoch \d+/\d+: test AUC ([\d.]+), logloss ([\d.]+)", output, re.MULTILINE)]
    counted = re.search(r"vocabulary: .* counted in ([\d.]+) s", output)
    return {"file": kind, "setting": setting, "first_step_s": round(first_step, 1),
            "total_s": round(seconds, 1), "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2),
            "pass_s": float(counted.group(1)) if counted else None, "epochs": epochs,
            "tables": next((line.strip() for line in lines if line.startswith("placement")), ""),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "command": " ".join(command[1:])}


def report(path):
    """A table per invocation (runs of one --note side by side; timings compare only within
    one), the means over its rounds."""
    with open(path) as stream:
        records = [json.loads(line) for line in stream if line.strip()]
    invocations = {}
    for record in records:
        invocations.setdefault(record["note"], []).append(record)
    for note, runs_of_note in invocations.items():
        print(f"\n{runs_of_note[0]['date']}, {runs_of_note[0]['machine']}; {note}\n")
        print("| file | setting | runs | first step s | total s | peak RSS GB | "
              "test AUC by epoch |")
        print("|---|---|---|---|---|---|---|")
        groups = {}
        for record in runs_of_note:
            groups.setdefault((record["file"], record["setting"]), []).append(record)
        for (kind, setting), runs in groups.items():
            aucs = " / ".join(f"{statistics.mean([r['epochs'][e]['auc'] for r in runs]):.4f}"
                              for e in range(len(runs[0]["epochs"])))
            print(f"| {kind} | {setting} | {len(runs)} | "
                  f"{statistics.mean([r['first_step_s'] for r in runs]):.1f} | "
                  f"{statistics.mean([r['total_s'] for r in runs]):.1f} | "
                  f"{max(r['peak_rss_gb'] for r in runs):.2f} | {aucs} |")


def main(argv):
    del argv
    if FLAGS.report:
        report(FLAGS.results)
        return
    from benchmarks.timing import cpu_flags, machine_description

    files = write_files(FLAGS.data_dir, FLAGS.rows)
    machine = f"{machine_description()}; flags {cpu_flags()}"
    for round_index in range(FLAGS.rounds):
        order = FLAGS.settings if round_index % 2 == 0 else FLAGS.settings[::-1]
        for kind in FLAGS.files:
            for setting in order:
                record = run(kind, setting, *files[kind])
                record.update(machine=machine, date=time.strftime("%Y-%m-%d"), round=round_index,
                              rows=FLAGS.rows, note=FLAGS.note)
                print(json.dumps(record), flush=True)
                with open(FLAGS.results, "a") as out:
                    out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    app.run(main)
