"""The advice of errors and help texts can be followed: every `--flag` a string of launch/ or
tfscale/ names (an error's suggested command, a flag's help) is one the program defines, its
value one of the flag's choices when the flag is an enum; every library argument the launchers
tell as a flag (launch.user_errors.ARGUMENT_FLAGS) is a launch.train flag, and each
`argument=value` a library message suggests is, told in flag terms, a valid flag and value."""

import ast
import pathlib
import re

import pytest

from launch.user_errors import ARGUMENT_FLAGS, in_flag_terms
from tests.flag_definitions import PLACEHOLDER, option_problems, read

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAUNCHERS = ("launch.train", "launch.predict", "launch.export", "launch.build_vocab")
OPTION = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)(?:=([\w.+-]*))?")
# Another program's option that a message names, and a word the message must hold with it that
# tells whose it is.
OTHER_PROGRAMS = {"logdir": "tensorboard", "cap-add": "container"}
ARGUMENT = re.compile(r"`(\w+)=([^`]*)`")


def strings(path):
    """(line, text) of the string constants of the Python file `path` (the constant parts of
    f-strings too), docstrings left out (they speak of the library's arguments)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def source_files():
    return sorted((ROOT / "launch").glob("*.py")) + sorted((ROOT / "tfscale").rglob("*.py"))


def program_of(path):
    """The program whose flags a string of `path` names: tfscale.run's own files speak of its
    options, every other file of the launchers'."""
    return "tfscale.run" if path.name in ("run.py", "run_namespace.py") else "launchers"


@pytest.fixture(scope="module")
def definitions():
    found = read(LAUNCHERS + ("tfscale.run",))
    launchers = {"flags": {}, "booleans": []}
    for launcher in LAUNCHERS:
        launchers["flags"].update(found[launcher]["flags"])
        launchers["booleans"] += found[launcher]["booleans"]
    return {"launchers": launchers, "tfscale.run": found["tfscale.run"],
            "launch.train": found["launch.train"]}


def suggested_options(text):
    """[(name, value or None)] of the --options `text` names, other programs' left out."""
    return [(name, value or None) for name, value in OPTION.findall(text)
            if not (name in OTHER_PROGRAMS and OTHER_PROGRAMS[name] in text)]


def test_suggested_flags_exist_with_valid_values(definitions):
    problems = []
    for path in source_files():
        program = program_of(path)
        for line, text in strings(path):
            problems += [f"{path.relative_to(ROOT)}:{line}: {problem}"
                         for problem in option_problems(program, suggested_options(text),
                                                        definitions[program])]
    assert not problems, "advice naming flags that cannot be given:\n" + "\n".join(problems)


def test_arguments_told_as_flags_are_flags(definitions):
    train = definitions["launch.train"]["flags"]
    assert not {argument: flag for argument, flag in ARGUMENT_FLAGS.items()
                if flag not in train}, "ARGUMENT_FLAGS names flags launch.train does not define"


def test_library_advice_in_flag_terms_is_valid(definitions):
    """A library message's `argument=value` (with a literal value), as the launchers print it."""
    problems, told = [], 0
    for path in sorted((ROOT / "tfscale").rglob("*.py")):
        for line, text in strings(path):
            for argument, value in ARGUMENT.findall(text):
                if argument not in ARGUMENT_FLAGS or PLACEHOLDER.match(value.strip("'\"")):
                    continue
                told += 1
                where = f"{path.relative_to(ROOT)}:{line}: `{argument}={value}`"
                try:
                    options = suggested_options(in_flag_terms(f"`{argument}={value}`"))
                except (ValueError, SyntaxError) as error:  # a dict value that is no literal
                    problems.append(f"{where}: not told as a flag ({error})")
                    continue
                problems += [f"{where}: {problem}" for problem in option_problems(
                    "launch.train", options, definitions["launch.train"])]
    assert told, "no library message suggests an argument's value: the scan finds nothing"
    assert not problems, "library advice that the launchers tell as invalid flags:\n" + "\n".join(
        problems)


def test_the_scan_catches_a_wrong_flag_and_value(definitions):
    options = suggested_options("give --embedding_sharding=rows, or --no_such_flag; "
                                "tensorboard --logdir runs")
    assert options == [("embedding_sharding", "rows"), ("no_such_flag", None)]
    problems = option_problems("launchers", options, definitions["launchers"])
    assert [problem.split(":")[1].strip() for problem in problems] == [
        "--embedding_sharding=rows", "--no_such_flag is not defined"]
    told = suggested_options(in_flag_terms('use `embedding_exchange="allgathered"`'))
    assert told == [("embedding_comm", "allgathered")]
    assert option_problems("launch.train", told, definitions["launch.train"])
