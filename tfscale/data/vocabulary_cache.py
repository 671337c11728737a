"""The automatic vocabulary: counted in one pass over the training lines the first time a set of
files is trained on, cached beside the data (or in a given directory), and reused while the files
keep their size and modification time; any change, or other counting settings, counts again.

Owns: the cache file's name, what makes a cached vocabulary still valid (`sources`), and the
messages while counting. The counting itself is the reader class's `build_vocabulary`
(DelimitedTextSource's, or ParquetSource's): under horovodrun every rank calls it, rank 0
writes the cache and prints.
"""

import hashlib
import json
import os
import time

from tfscale import distributed
from tfscale.data.text_lines import VOCABULARY_CACHE_MARK, resolve_paths
from tfscale.data.vocabulary import Vocabulary
from tfscale.errors import UserError

# No extension (the file is told by its first bytes), so that a "*.parquet" of the data's own
# directory does not name it either.
_SUFFIX = VOCABULARY_CACHE_MARK + "{}"


def files_signature(paths):
    """[path, size, modification time in ns] of each file: what must not change for a cache to
    stay valid."""
    signature = []
    for path in paths:
        status = os.stat(path)
        signature.append([os.path.abspath(path), int(status.st_size), int(status.st_mtime_ns)])
    return signature


def _settings(source_class, paths, min_count, test_fraction, on_bad_line, on_short_line):
    settings = {"format": source_class.FORMAT.name, "min_count": int(min_count),
                "test_fraction": None if test_fraction is None else float(test_fraction),
                "on_bad_line": on_bad_line, "on_short_line": on_short_line,
                "files": [os.path.abspath(p) for p in paths]}
    if getattr(source_class, "COLUMNS", None):  # a Parquet reader's column mapping
        settings["columns"] = dict(source_class.COLUMNS)
    return json.loads(json.dumps(settings))  # the form it takes after a round trip through JSON


def cache_path(paths, settings, cache_dir=None):
    """Where the vocabulary of `paths` counted with `settings` is cached: beside the first file,
    or in `cache_dir`, under a name keyed by the settings (so a run with another min count keeps
    its own)."""
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    name = os.path.basename(paths[0]) + _SUFFIX.format(digest)
    return os.path.join(cache_dir or os.path.dirname(os.path.abspath(paths[0])), name)


def cached_vocabulary(source_class, paths, *, min_count, test_fraction=None, on_bad_line="error",
                      on_short_line="missing", cache_dir=None, print_fn=print):
    """The Vocabulary of the training lines of `paths` (a reader class's train files; with
    `test_fraction`, only the lines its hashed split trains on), from the cache when it is valid,
    else counted now and cached. `print_fn` gets one line saying which, and progress lines while
    counting (on rank 0 only). Under horovodrun every rank must call it and gets the same."""
    files = resolve_paths(paths)
    settings = _settings(source_class, files, min_count, test_fraction, on_bad_line,
                         on_short_line)
    path = cache_path(files, settings, cache_dir)
    sources = dict(settings, signature=files_signature(files))
    if not distributed.is_chief():
        print_fn = lambda line: None  # noqa: E731 (rank 0 tells)
    cached, reason = distributed.broadcast_from_chief(
        lambda: _valid_cache(path, sources), name="tfscale_vocabulary_cache")
    if cached is not None:
        print_fn(f"vocabulary: {_summary(cached)}, cached in {path} (the files are unchanged)")
        return cached
    described = files[0] + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    total_bytes = sum(size for _, size, _ in sources["signature"])
    print_fn(f"vocabulary: counting the categorical values of {described} "
             f"({total_bytes / 1e6:,.1f} MB; {reason})")
    started = time.monotonic()

    def progress(rows):
        seconds = time.monotonic() - started
        print_fn(f"vocabulary: {rows:,} lines counted in {seconds:.0f} s "
                 f"({rows / max(seconds, 1e-9):,.0f} lines/s)")

    vocabulary = source_class.build_vocabulary(
        files, min_count=min_count, on_bad_line=on_bad_line, on_short_line=on_short_line,
        test_fraction=test_fraction, progress=progress)
    vocabulary.sources = sources
    if distributed.is_chief():
        try:
            vocabulary.save(path)
        except OSError as error:
            raise UserError(f"{path}: cannot write the vocabulary cache ({error}); give a "
                            "writable `vocabulary_cache_dir`") from None
    print_fn(f"vocabulary: {_summary(vocabulary)}, counted in {time.monotonic() - started:.1f} s "
             f"and cached in {path}")
    return vocabulary


def _valid_cache(path, sources):
    """(the cached Vocabulary, None) when `path` holds one of `sources`, else (None, why not)."""
    if not os.path.exists(path):
        return None, "no cached vocabulary yet"
    try:
        cached = Vocabulary.load(path)
    except UserError as error:
        return None, f"the cached one is unreadable ({error})"
    if cached.sources != sources:
        return None, "the files changed since it was cached"
    return cached, None


def _summary(vocabulary):
    kept = sum(len(entries) for entries in vocabulary.categorical.values())
    return (f"{kept:,} values with count >= {vocabulary.min_count} in "
            f"{len(vocabulary.categorical)} fields from {vocabulary.rows:,} training lines")


def fitted_hash_buckets(vocabulary, names, hash_buckets, room=2):
    """Hash buckets per field no larger than the field needs: `room` times its distinct values
    in `vocabulary` (the counted training lines), at most `hash_buckets`."""
    if vocabulary.distinct is None:
        raise UserError(f"{vocabulary.path}: the vocabulary does not record distinct counts; "
                        "rebuild it")
    return tuple(max(1, min(int(hash_buckets), room * int(vocabulary.distinct[name])))
                 for name in names)
