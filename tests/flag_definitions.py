"""The flags each command-line program of the repository defines, read from its own help text
(`read(programs)` from a test), and what is wrong with options given to one (`option_problems`).
`python tests/flag_definitions.py PROGRAM...` (a module as `launch.train`, or a script's path)
prints the JSON {program: {"flags": {name: [choices] or null}, "booleans": [name, ...]}}, or
{program: {"error": output}} for a program whose help lists no flag.

TensorFlow and absl are imported once; each program then runs in a child forked from that
process, as `python -m PROGRAM --helpfull` (absl's flags) or, when that lists none,
`--help` (argparse's options) runs it. Names are given without their dashes (argparse's
single-dash options too: "np" for `-np`); an enum flag or an option with `choices` gives its
choices, a flag taking any value null. A boolean absl flag is also taken as `--noNAME`."""

import functools
import importlib
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_SECONDS = 120
# A value written as a placeholder (`--dynamic_capacity=N`, `--embedding_sharding=KIND`).
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|^<.*>$|^$")
# absl --helpfull: `  --[no]name: help` or `  --name: <a|b|c>: help` (an enum's choices).
ABSL_FLAG = re.compile(r"^\s*--(\[no\])?([\w-]+):(?: <([^>]*)>:)?", re.M)
# argparse --help: `  -np N, --num-proc N  help`, `  --network {private,host}  help`.
ARGPARSE_OPTION = re.compile(r"^ {2}(-[^ ].*?)(?: {2,}|$)", re.M)


def parse_absl(text):
    flags, booleans = {}, []
    for no, name, choices in ABSL_FLAG.findall(text):
        flags[name] = choices.split("|") if choices else None
        if no:
            booleans.append(name)
    return flags, booleans


def parse_argparse(text):
    flags = {}
    for spec in ARGPARSE_OPTION.findall(text):
        for option in spec.split(", "):
            name, _, metavar = option.partition(" ")
            if not re.fullmatch(r"--?[A-Za-z][\w-]*", name):
                continue
            choices = re.fullmatch(r"\{([^}]*)\}", metavar)
            flags[name.lstrip("-")] = choices.group(1).split(",") if choices else None
    return flags, []


def _run_in_child(program, argument):
    """What `python -m program argument` (or `python program argument`) writes, run in a
    forked child of this process."""
    with tempfile.TemporaryFile("w+") as output:
        pid = os.fork()
        if pid == 0:  # the child: its stdout and stderr into `output`, then the program
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
            sys.argv = [program, argument]
            try:
                if program.endswith(".py"):
                    runpy.run_path(program, run_name="__main__")
                else:
                    runpy.run_module(program, run_name="__main__", alter_sys=True)
            except SystemExit:
                pass
            except BaseException as error:  # noqa: B036 (reported in the output)
                print(f"{type(error).__name__}: {error}")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        deadline = time.monotonic() + CHILD_SECONDS
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return f"{program} {argument}: no answer in {CHILD_SECONDS} s"
            time.sleep(0.05)
        output.seek(0)
        return output.read()


def definitions(program):
    text = _run_in_child(program, "--helpfull")
    flags, booleans = parse_absl(text)
    if not flags:
        text = _run_in_child(program, "--help")
        flags, booleans = parse_argparse(text)
    if not flags:
        return {"error": text[-3000:]}
    return {"flags": flags, "booleans": booleans}


@functools.lru_cache(maxsize=None)
def read(programs):
    """{program: {"flags": {name: choices or None}, "booleans": [...]}} of the tuple
    `programs`, read by this script in a process of its own."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run([sys.executable, os.path.abspath(__file__), *programs], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    missing = {program: found[program].get("error") for program in programs
               if "flags" not in found.get(program, {})}
    assert not missing, f"programs whose help lists no flags: {missing}"
    return found


def option_problems(program, options, definitions):
    """What is wrong with `options` [(name, value or None)] of `program` (its `definitions`,
    as read gives them): an option it does not define (`--noNAME` counts for a boolean NAME),
    or a value outside an enum's choices."""
    flags, booleans = definitions["flags"], definitions["booleans"]
    problems = []
    for name, value in options:
        if name not in flags:
            if not (name.startswith("no") and name[2:] in booleans):
                problems.append(f"{program}: --{name} is not defined")
            continue
        choices, value = flags[name], (value or "").rstrip(".,;:)")  # the prose's punctuation
        if choices and not PLACEHOLDER.match(value):
            problems += [f"{program}: --{name}={value}: {part!r} is not one of {choices}"
                         for part in value.split(",") if part not in choices]
    return problems


def main(programs):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for module in ("tensorflow", "keras", "absl.app"):  # once, before the children
        importlib.import_module(module)

    print(json.dumps({program: definitions(program) for program in programs}))


if __name__ == "__main__":
    main(sys.argv[1:])
