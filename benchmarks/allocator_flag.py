"""--allocator_pad_mib, the C allocator set in a benchmark's process as launch.train's
--retain_freed_memory_mib sets it (one definition for every benchmark that reads files), and
`apply()`, which sets it by this tree's tfscale/data/allocator.py loaded by its path: the same
setting whichever tree's readers a benchmark measures (its --old_tree's may predate the
module)."""

import importlib.util
import pathlib

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("allocator_pad_mib", 64,
                     "launch.train's --retain_freed_memory_mib (its default): MiB of freed "
                     "memory each malloc heap keeps; 0 leaves the C allocator as it is.",
                     lower_bound=0)


def apply():
    """--allocator_pad_mib in this process (0: nothing)."""
    if not FLAGS.allocator_pad_mib:
        return
    path = pathlib.Path(__file__).resolve().parent.parent / "tfscale" / "data" / "allocator.py"
    spec = importlib.util.spec_from_file_location("benchmark_allocator", path)
    allocator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(allocator)
    if not allocator.retain_freed_memory(FLAGS.allocator_pad_mib << 20):
        raise RuntimeError("the C library is not glibc: --allocator_pad_mib cannot be set")
