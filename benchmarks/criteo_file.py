"""A realistic Criteo-format test file: label, 13 integer fields (Zipf-drawn, 20% missing, I2
negative at times) and 26 categorical fields of 8 hex digits whose values are Zipf-drawn (some
fields of a few dozen values, others of about a million), 3% missing (40% in C19-C26). Written
by the vocabulary-pass and input-path benchmarks."""

ZIPF_EXPONENTS = (1.08, 2.0, 1.05, 1.15, 2.5, 3.0, 1.1, 2.0, 4.0, 1.2, 1.12, 1.05, 1.3,
                  2.5, 1.3, 1.05, 3.0, 1.5, 2.0, 3.0, 1.05, 3.0, 2.5, 1.1, 2.0, 1.1)


def make_file(path, lines, seed=0, exponents=ZIPF_EXPONENTS):
    """Writes the test file (see the module doc) with pyarrow's CSV writer; `exponents`: the
    Zipf exponent of each categorical field's values (smaller: more distinct values)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    columns = {"label": pa.array((rng.random(lines) < 0.25).astype(np.int64))}
    for i in range(13):
        values = rng.zipf(1.6, lines).astype(np.int64) - 1 - (3 if i == 1 else 0)
        columns[f"I{i + 1}"] = pa.array(values, mask=rng.random(lines) < 0.2)
    for field, exponent in enumerate(exponents):
        ids = rng.zipf(exponent, lines).astype(np.uint64)
        keys = ((ids * np.uint64(0x9E3779B97F4A7C15) + np.uint64(field * 7919))
                >> np.uint64(32)).astype(np.uint32)
        digits = np.stack([(keys >> (28 - 4 * k)) & 15 for k in range(8)], axis=1)
        text = np.ascontiguousarray(hex_digits[digits]).view("S8").ravel().astype(object)
        text[rng.random(lines) < (0.4 if field >= 18 else 0.03)] = None
        columns[f"C{field + 1}"] = pa.array(text, pa.binary())
    pacsv.write_csv(pa.table(columns), path, pacsv.WriteOptions(
        include_header=False, delimiter="\t", quoting_style="none"))
