"""The package's own rules: the facade's three lists agree, functions stay short, the
modules that worker processes and ``chute --help`` load never import TensorFlow, the wheel
holds every module, and install lines name what works for an unpublished package."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import chute
from chute import lazy

SRC = Path(chute.__file__).parent
LONGEST_FUNCTION = 120  # lines; a longer function is split into named steps


def _type_checking_names() -> dict[str, str]:
    """``name -> module`` of the facade's ``if TYPE_CHECKING:`` imports."""
    tree = ast.parse((SRC / "__init__.py").read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        names[alias.asname or alias.name] = statement.module or ""
    return names


def test_all_the_lazy_table_and_the_type_checking_imports_name_the_same_things():
    exports = chute._EXPORTS
    typed = _type_checking_names()
    assert sorted(chute.__all__) == sorted(exports) == sorted(typed)
    for name, target in exports.items():
        module, attribute = target if isinstance(target, tuple) else (target, name)
        assert typed[name] == module, name
        assert getattr(chute, name) is getattr(__import__(module, fromlist=[attribute]), attribute)


def test_an_unknown_name_on_the_facade_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        chute.nothing_here  # noqa: B018


def _long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_the_limit():
    assert _long_functions(SRC, LONGEST_FUNCTION) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
    assert _long_functions(tmp_path, LONGEST_FUNCTION) == [
        f"long.py:long ({LONGEST_FUNCTION + 1} lines)"
    ]


# What worker processes, a local conversion and `chute --help` import: none loads TensorFlow.
TENSORFLOW_FREE = [
    "chute.cli",
    "chute.image.decode",
    "chute.image.encode",
    "chute.ingest.sources",
    "chute.ingest.encode",
    "chute.ingest.workers",
    "chute.ingest.convert",
    "chute.format.records",
    "chute.format.storage",
    "chute.format.manifest",
    "chute.format.index",
    "chute.format.parse",
    "chute.tools.index",
    "chute.read.grain.source",
]


@pytest.mark.parametrize("module", TENSORFLOW_FREE)
def test_importing_does_not_load_tensorflow(module):
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules); "
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    return tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())


def test_tensorflow_is_an_extra_never_a_hard_requirement():
    """A hard tensorflow requirement made pip lay the plain wheel over a machine's own build
    (tensorflow-tpu, tensorflow-cpu beside JAX, tf-nightly): two distributions, one package."""
    project = _pyproject()["project"]
    names = [r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip()
             for r in project["dependencies"]]  # fmt: skip
    assert not any(name.startswith(("tensorflow", "tf-")) for name in names), names
    extras = project["optional-dependencies"]
    assert extras["tensorflow"] == ["tensorflow>=2.16"]
    assert extras["tensorflow-cpu"] == ["tensorflow-cpu>=2.16"]


def test_without_tensorflow_a_command_says_what_to_install_in_one_line(shared_dataset, tmp_path):
    # verify, train on JAX and the rest run without TensorFlow (tests/fit/
    # test_without_tensorflow.py); training on the TensorFlow backend cannot
    run = str(tmp_path / "run")
    code = (
        "import sys; sys.modules['tensorflow'] = None  # as if it were not installed\n"
        "from chute.cli import main\n"
        f"sys.exit(main(['train', {str(shared_dataset)!r}, '--backend', 'tensorflow', "
        f"'--run-dir', {run!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert lazy.extra("tensorflow") in done.stderr and "[tensorflow-cpu]" in done.stderr
    assert "'chute[" not in done.stderr and "Traceback" not in done.stderr


# chute is not on PyPI: its messages name what this chute was installed from.
@pytest.fixture
def installed_from(monkeypatch):
    """Sets what pip recorded about chute's install (``direct_url.json``; None: nothing)."""
    import importlib.metadata

    class Distribution:
        def __init__(self, record):
            self.record = record

        def read_text(self, name):
            assert name == "direct_url.json"
            return None if self.record is None else json.dumps(self.record)

    def install(record):
        lazy._origin.cache_clear()
        monkeypatch.setattr(importlib.metadata, "distribution", lambda _: Distribution(record))

    yield install
    lazy._origin.cache_clear()


def test_install_hints_name_the_clone_or_the_wheel_chute_came_from(installed_from, tmp_path):
    clone = tmp_path / "my clone"  # a space: the path is quoted for the shell
    clone.mkdir()
    installed_from({"url": clone.as_uri(), "dir_info": {"editable": True}})
    assert lazy.extra("grain", instead="grain") == (
        f"pip install -e '{clone}[grain]' (or pip install grain)"
    )
    installed_from({"url": clone.as_uri(), "dir_info": {}})  # `pip install .` from the clone
    assert lazy.extra("s3") == f"pip install '{clone}[s3]'"
    wheel = tmp_path / "chute-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    installed_from({"url": wheel.as_uri(), "archive_info": {}})
    assert lazy.extra("tensorflow") == f"pip install '{wheel}[tensorflow]'"
    assert lazy.tensorflow_builds().startswith(f"pip install '{wheel}[tensorflow]' (CPU or GPU")
    # unknown, or no longer there: a clone's command
    clone_command = "pip install -e '.[grain]' in a clone of chute (or pip install grain)"
    wheel.unlink()
    for record in (
        {"url": wheel.as_uri(), "archive_info": {}},
        {"url": "https://github.com/x/chute", "vcs_info": {"vcs": "git"}},
        None,
    ):
        installed_from(record)
        assert lazy.extra("grain", instead="grain") == clone_command


def test_no_message_asks_pypi_for_chute():
    """``pip install 'chute[grain]'`` answers "No matching distribution found": chute is not
    published; every install line goes through lazy.extra."""
    found = [
        f"{path.relative_to(SRC)}:{number}"
        for path in sorted(SRC.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"pip install\W+chute\b|chute\[", line) and path.name != "lazy.py"
    ]
    assert found == []


def test_the_wheel_ships_every_module_and_data_file_chute_reads():
    """The wheel holds the packages setuptools finds under src/ and, besides their modules, only
    what [tool.setuptools.package-data] names: a folder that packages.find leaves out, or a
    data file not named there, would be missing from an installed chute (CI's `make
    package-check` builds and installs the real wheel; a build here would need the network
    for setuptools>=77, which the suite's virtualenv need not have)."""
    from setuptools import find_namespace_packages, find_packages

    setuptools_config = _pyproject()["tool"]["setuptools"]
    find = dict(setuptools_config["packages"]["find"])
    assert find.pop("where") == ["src"]
    # pyproject.toml's find takes folders without __init__.py too, unless namespaces = false
    finder = find_namespace_packages if find.pop("namespaces", True) else find_packages
    packages = set(finder(str(SRC.parent), **find))
    folders = {
        ".".join(path.parent.relative_to(SRC.parent).parts)
        for path in SRC.rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert folders <= packages, folders - packages
    declared = setuptools_config.get("package-data", {})
    data = [
        path
        for path in SRC.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    ]
    missing = [
        str(path.relative_to(SRC.parent))
        for path in data
        if not any(
            path.match(pattern)
            for package, patterns in declared.items()
            if package in ("*", ".".join(path.parent.relative_to(SRC.parent).parts))
            for pattern in patterns
        )
    ]
    assert missing == []
