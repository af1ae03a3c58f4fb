"""Packaging checks: pyproject.toml, environment.yml, README and .ci/run agree with each other,
and `import tempo_lab` stays free of the notebook stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

ROOT = Path(__file__).resolve().parents[1]

# Conda packages in environment.yml that have no PyPI counterpart in pyproject.toml.
# (`graphviz` on conda-forge is the `dot` program, which the views run as a subprocess.)
CONDA_ONLY = {"python", "pip", "graphviz"}

# Modules that `import tempo_lab` must not pull in (docs/architecture.md, "Layers"): the notebook stack lives in
# tempo_lab/widgets/, which the rest of tempo_lab imports only lazily (explore()).
FORBIDDEN_AT_IMPORT = ("IPython", "ipywidgets", "plotly", "graphviz", "tempo_lab.widgets")


def _norm(name: str) -> str:
    """PEP 503 normalised name; conda-forge names follow the same convention."""
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def environment() -> dict:
    yaml = pytest.importorskip("yaml")
    with open(ROOT / "environment.yml", encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def pypi_requirements(pyproject) -> dict[str, Requirement]:
    """Core dependencies plus every extra, self-references (tempo_lab[...]) expanded."""
    project = pyproject["project"]
    own = _norm(project["name"])
    extras = project.get("optional-dependencies", {})
    reqs: dict[str, Requirement] = {}
    seen_extras: set[str] = set()

    def add(lines: list[str]) -> None:
        for line in lines:
            req = Requirement(line)
            if _norm(req.name) == own:
                for extra in req.extras:
                    assert extra in extras, f"{line!r} names an unknown extra {extra!r}"
                    if extra not in seen_extras:
                        seen_extras.add(extra)
                        add(extras[extra])
                continue
            key = _norm(req.name)
            assert key not in reqs or str(reqs[key].specifier) == str(req.specifier), (
                f"{req.name} is listed twice with different version specifiers"
            )
            reqs[key] = req

    add(project["dependencies"])
    for lines in extras.values():
        add(lines)
    return reqs


@pytest.fixture(scope="module")
def conda_names(pyproject) -> dict[str, str]:
    """Documented PyPI -> conda-forge name mapping (only names that differ)."""
    table = pyproject.get("tool", {}).get("tempo_lab", {}).get("conda-names", {})
    return {_norm(k): _norm(v) for k, v in table.items()}


@pytest.fixture(scope="module")
def conda_specs(environment) -> dict[str, str]:
    """Conda package name -> the rest of its spec (e.g. '>=1.26'), pip section excluded."""
    specs: dict[str, str] = {}
    for dep in environment["dependencies"]:
        if isinstance(dep, dict):
            continue
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*", str(dep))
        assert m, f"cannot parse conda dependency {dep!r}"
        key = _norm(m.group(1))
        assert key not in specs, f"{m.group(1)} is listed twice in environment.yml"
        specs[key] = m.group(2)
    return specs


def test_environment_basics(environment):
    assert environment["name"] == "tempo_lab"
    assert environment["channels"] == ["conda-forge"]


def test_python_version_agrees(pyproject, conda_specs):
    requires = SpecifierSet(pyproject["project"]["requires-python"])
    assert "python" in conda_specs, "environment.yml must pin python"
    m = re.fullmatch(r"=?=?\s*(\d+\.\d+)(?:\.\*)?", conda_specs["python"])
    assert m, f"expected a 'python=X.Y' pin, got {conda_specs['python']!r}"
    assert requires.contains(m.group(1) + ".0"), (
        f"environment.yml's python {m.group(1)} violates requires-python {requires}"
    )


def test_every_pypi_dependency_is_in_environment(pypi_requirements, conda_names, conda_specs):
    missing = []
    for key, req in sorted(pypi_requirements.items()):
        conda = conda_names.get(key, key)
        if conda not in conda_specs:
            missing.append(f"{req.name} (conda-forge: {conda})")
    assert not missing, (
        "in pyproject.toml but not in environment.yml: "
        + ", ".join(missing)
        + " — add them there, or map the name in [tool.tempo_lab.conda-names]"
    )


def test_version_bounds_agree(pypi_requirements, conda_names, conda_specs):
    for key, req in sorted(pypi_requirements.items()):
        conda = conda_names.get(key, key)
        spec = conda_specs.get(conda)
        if spec is None:
            continue  # reported by test_every_pypi_dependency_is_in_environment
        try:
            conda_set = SpecifierSet(spec)
        except InvalidSpecifier:
            pytest.fail(f"environment.yml: {conda} {spec!r} is not a PEP 440 specifier")
        assert conda_set == req.specifier, (
            f"{req.name}: pyproject.toml says {str(req.specifier)!r}, environment.yml says {spec!r}"
        )


def test_every_conda_package_is_in_pyproject(pypi_requirements, conda_names, conda_specs):
    from_pypi = {conda_names.get(key, key) for key in pypi_requirements}
    extra = sorted(set(conda_specs) - from_pypi - CONDA_ONLY)
    assert not extra, (
        f"in environment.yml but not in pyproject.toml: {', '.join(extra)} — add them to "
        "pyproject.toml (core or an extra), or map the name in [tool.tempo_lab.conda-names]"
    )


def test_conda_only_packages_present(conda_specs):
    # The `dot` program is needed for SVG views; pip cannot install it.
    assert {"python", "pip", "graphviz"} <= set(conda_specs)


def test_pip_section_installs_project_with_extras(environment, pyproject):
    pip_sections = [d["pip"] for d in environment["dependencies"] if isinstance(d, dict)]
    assert len(pip_sections) == 1, "environment.yml needs exactly one `pip:` section"
    extras_defined = set(pyproject["project"]["optional-dependencies"])
    installs = []
    for line in pip_sections[0]:
        m = re.fullmatch(r"-e\s+\.(?:\[([^\]]*)\])?", str(line).strip())
        if m:
            installs.append({e.strip() for e in (m.group(1) or "").split(",") if e.strip()})
    assert len(installs) == 1, "the pip section must install the project once, as `-e .[...]`"
    extras = installs[0]
    assert extras, "the pip section must install the project with its extras, e.g. `-e .[dev]`"
    assert extras <= extras_defined, f"unknown extras {sorted(extras - extras_defined)}"
    assert "dev" in extras or extras >= extras_defined - {"dev"}


# Extras that CI must never install: benchmark references (transformers, torch) only.
NOT_FOR_CI = {"bench"}


def test_dev_extra_covers_all_extras_but_the_benchmark_references(pyproject):
    extras = pyproject["project"]["optional-dependencies"]
    dev = {_norm(Requirement(line).name) for line in extras["dev"]}
    own = _norm(pyproject["project"]["name"])
    referenced = set()
    for line in extras["dev"]:
        req = Requirement(line)
        if _norm(req.name) == own:
            referenced |= set(req.extras)
    for name, lines in extras.items():
        if name == "dev":
            continue
        for line in lines:
            key = _norm(Requirement(line).name)
            if name in NOT_FOR_CI:
                assert name not in referenced and key not in dev, f"CI would install {line!r}"
            else:
                assert name in referenced or key in dev, f"dev extra lacks {line!r} ([{name}])"


def test_packages_discovered(pyproject):
    """Every package of the repository is installed, all under ``tempo_lab`` (a top-level
    ``widgets`` would collide with any other package so named)."""
    from setuptools import find_packages

    find = pyproject["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(where=str(ROOT), include=find["include"])
    assert "tempo_lab.widgets" in found and "tempo_lab.runtime" in found
    assert {p.split(".")[0] for p in found} == {"tempo_lab"}
    on_disk = {str(d.parent.relative_to(ROOT)).replace("/", ".")
               for d in (ROOT / "tempo_lab").rglob("__init__.py")}
    assert on_disk <= set(found)


def test_nbval_sanitize_file_parses(pyproject):
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "--nbval" in addopts and "--nbval-current-env" in addopts
    path = ROOT / addopts[addopts.index("--nbval-sanitize-with") + 1]
    text = path.read_text(encoding="utf-8")
    # nbval reads pairs of lines `regex: ...` / `replace: ...` with this very pattern
    # (nbval.plugin.get_sanitize_patterns); a rule it cannot pair is silently ignored.
    pairs = re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)
    n_regex = len(re.findall(r"^regex:", text, flags=re.MULTILINE))
    assert pairs and len(pairs) == n_regex, "every `regex:` line needs a `replace:` line below it"
    for regex, replace in pairs:
        assert regex == regex.rstrip() and replace == replace.rstrip(), "trailing whitespace"
        re.sub(regex, replace, "at 0x1f \x1b[31m 1.5 ms")  # compiles and substitutes

    def sanitize(s: str) -> str:
        for regex, replace in pairs:
            s = re.sub(regex, replace, s)
        return s

    assert sanitize("<X at 0x7f00aBc>") == "<X at 0xADDR>"
    assert sanitize("\x1b[1;31mred\x1b[0m") == "red"
    assert sanitize("took 12.3 ms, 0.5s, 1.2 µs") == "took <duration>, <duration>, <duration>"
    assert sanitize("/tmp/ipykernel_123/4567.py:3") == "<cell>:3"
    assert sanitize("12345678-1234-1234-1234-123456789abc") == "<uuid>"
    assert sanitize('<?xml version="1.0"?>\n<svg a="1">\n<g/>\n</svg>') == "<svg/>"
    assert sanitize("SDG(ops=14, edges=19, dims=(b, t)) float32 2 steps") == (
        "SDG(ops=14, edges=19, dims=(b, t)) float32 2 steps"
    )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", readme, flags=re.MULTILINE | re.DOTALL)
    commands = [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if re.match(r"\s*python -m pytest\b", line)
    ]
    assert commands, "README.md shows no `python -m pytest` command"
    command = commands[0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pattern = r"^\s*" + re.escape(command) + r"(?:\s*$|\s+(?:2>&1|\||>|;|&&))"
    assert re.search(pattern, ci, flags=re.MULTILINE), (
        f".ci/run must run the README's test command verbatim: {command!r}"
    )
    assert os.access(ROOT / ".ci" / "run", os.X_OK), ".ci/run must be executable"


def test_import_does_not_load_notebook_stack():
    """`import tempo_lab` in a fresh interpreter loads none of the notebook/UI packages."""
    code = (
        "import json, sys\n"
        "import tempo_lab\n"
        f"names = {FORBIDDEN_AT_IMPORT!r}\n"
        "print(json.dumps(sorted(n for n in names if n in sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"`import tempo_lab` failed:\n{proc.stderr}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], (
        f"`import tempo_lab` imported {loaded}; import them lazily inside the functions that "
        "need them (e.g. explore()), or move the code to tempo_lab/widgets/"
    )


def test_licence_in_the_file_and_the_metadata(pyproject):
    assert pyproject["project"]["license"] == "MIT"
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


def test_the_tempo_lab_command(pyproject, capsys):
    from tempo_lab import cli

    assert pyproject["project"]["scripts"]["tempo-lab"] == "tempo_lab.cli:main"
    assert cli.main(["info"]) == 0
    assert "jax" in capsys.readouterr().out
    assert cli.main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    assert cli.main([]) == 2 and "demo" in capsys.readouterr().out
    for name, (module, _) in cli.COMMANDS.items():  # each names a module with a main
        assert module is None or callable(__import__(module, fromlist=["main"]).main), name


def test_the_command_refuses_unknown_arguments_and_tells_its_version(pyproject, capsys):
    """``tempo-lab info --bogus`` printed the versions and exited 0; ``--version`` was an
    unknown command. A usage error exits 2 with the usage, as argparse does."""
    from tempo_lab import cli

    assert cli.main(["info", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "usage: tempo-lab info" in err and "--bogus" in err
    for flag in ("--version", "-V"):
        assert cli.main([flag]) == 0
        assert capsys.readouterr().out == f"tempo-lab {pyproject['project']['version']}\n"
    assert cli.main(["info", "--help"]) == 0 and "usage: tempo-lab info" in capsys.readouterr().out


def test_the_wheel_ships_the_typing_marker(pyproject):
    """``tempo_lab/py.typed`` (PEP 561: type checkers read an installed package's hints only
    with it) is in the package data that setuptools puts in the wheel."""
    import fnmatch

    assert (ROOT / "tempo_lab" / "py.typed").is_file()
    data = pyproject["tool"]["setuptools"]["package-data"]
    assert any(fnmatch.fnmatch("py.typed", p) for key in ("tempo_lab", "*")
               for p in data.get(key, []))


def test_explore_without_the_viz_extra_names_it(pyproject, monkeypatch):
    """Without the viz extra's packages, ``explore()`` raised a bare ModuleNotFoundError from
    inside the package: a located MissingExtraError (an ImportError too) that says how to
    install them."""
    import tempo_lab as tl
    from tempo_lab.stage import VIZ_PACKAGES

    assert {Requirement(r).name for r in pyproject["project"]["optional-dependencies"]["viz"]} \
        == set(VIZ_PACKAGES)
    for name in [m for m in sys.modules if m.startswith("tempo_lab.widgets")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [*VIZ_PACKAGES, *(m for m in sys.modules if m.split(".")[0] in VIZ_PACKAGES)]:
        monkeypatch.setitem(sys.modules, name, None)          # importing them fails
    ctx = tl.Context(dims=("t",))
    with ctx:
        x = tl.zeros(()) + 1.0
    with pytest.raises(ImportError) as info:
        ctx.trace.explore()
    err = info.value
    assert isinstance(err, tl.MissingExtraError) and err.loc.file == __file__
    assert 'pip install "tempo_lab[viz]"' in str(err) and "is not installed" in str(err), err
    del x
