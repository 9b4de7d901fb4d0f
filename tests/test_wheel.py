"""The wheel installs clean: `python -m build` makes an sdist and, from it, a wheel; the wheel
installed in a fresh virtual environment runs `fedrec --help` and a one-epoch run from a
folder outside the repository, importing fedrec from that environment alone.

How the check is built, and why:

* The build runs on a copy of the files a fresh clone with the working tree's changes holds
  (results/, benchmarks/ and docs/ among them), not on the working tree, where an earlier
  build's file lists would mask a file the package configuration misses.
* The build uses ``--no-isolation``: the build backend (setuptools) comes from this environment
  (the ``dev`` extra holds it and ``build``), so the check needs no network. The wheel is built
  from the sdist, so a file the sdist misses fails here too.
* The fresh environment gets the wheel with ``pip install --no-index --no-deps``, and the
  dependencies through a ``.pth`` file that names this environment's site-packages folders.
  Installing them afresh would download PyTorch and the rest on every run (minutes, and PyPI's
  default torch is a multi-gigabyte CUDA build); `--find-links` or constraints would still need
  their wheels on disk. In exchange, the test checks with `importlib.metadata`, inside the fresh
  environment, that every requirement the wheel declares (its Requires-Dist without an extra) is
  met by what it sees.
* A folder a ``.pth`` line names joins ``sys.path``, but the ``.pth`` files inside it are not
  run: the editable install's finder and path hooks of this environment stay out. The test
  checks it (no ``__editable__`` finder, no repository folder on ``sys.path``, fedrec and its
  metadata found in the fresh environment), with ``PYTHONPATH`` removed and the repository not
  the working folder.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedrec"
FIGURES = PACKAGE / "reproduce" / "figures"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST = f"{PROJECT['name']}-{PROJECT['version']}"

#: top-level folders of the repository that neither the wheel nor the sdist may hold
NOT_SHIPPED = {"tests", "results", "benchmarks", "configs", "docs", "runs", ".devdata", ".ci",
               "build", "dist"}


def _run(args: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          **kwargs)
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _checkout(folder: Path) -> Path:
    """The repository as a fresh clone with the working tree's changes would hold it (the files
    git tracks or would add), copied to `folder`; the repository itself where git cannot say.
    A build in the working tree would also read what earlier builds left there: setuptools
    adds the files an old ``fedrec.egg-info/SOURCES.txt`` lists to the sdist."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ROOT
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not a tracked file deleted in the working tree
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel `python -m build` makes of the repository."""
    source = _checkout(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source], cwd=source)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


def _package_files() -> set[str]:
    """The package's source files as a wheel names them: every module, and the data fedrec
    reads from inside the package at run time (`fedrec.reproduce.papers`' figures)."""
    modules = {p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    data = {PACKAGE / "py.typed", FIGURES / "README.md", *FIGURES.glob("*.csv")}
    return {p.relative_to(ROOT).as_posix() for p in modules | data}


def test_wheel_holds_the_package_and_nothing_else(built: tuple[Path, Path]) -> None:
    names = set(zipfile.ZipFile(built[1]).namelist())
    assert sorted(_package_files() - names) == []
    assert len(list(FIGURES.glob("*.csv"))) >= 1
    strays = {n for n in names if not n.startswith(("fedrec/", f"{DIST}.dist-info/"))}
    assert strays == set()
    # under fedrec/: modules, the typing marker, and the figures (CSV and their README) alone
    shipped = {n for n in names if n.startswith("fedrec/")}
    allowed = {n for n in shipped if n.endswith(".py") or n == "fedrec/py.typed"
               or n.startswith("fedrec/reproduce/figures/") and n.endswith((".csv", "README.md"))}
    assert shipped - allowed == set()


def test_wheel_metadata(built: tuple[Path, Path]) -> None:
    meta = email.message_from_bytes(zipfile.ZipFile(built[1]).read(f"{DIST}.dist-info/METADATA"))
    assert {"flower", "tune", "gpu", "parquet", "all", "dev"} <= set(meta.get_all("Provides-Extra"))
    assert meta["License-Expression"] == "MIT"
    assert {"Intended Audience :: Science/Research", "Typing :: Typed",
            "Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12",
            "Topic :: Scientific/Engineering :: Artificial Intelligence"} <= set(meta.get_all("Classifier"))
    assert meta["Keywords"] and meta["Author"] and meta["Requires-Python"] == PROJECT["requires-python"]
    entry_points = zipfile.ZipFile(built[1]).read(f"{DIST}.dist-info/entry_points.txt").decode()
    assert "fedrec = fedrec.cli:main" in entry_points


def test_sdist_holds_the_sources_and_no_junk(built: tuple[Path, Path]) -> None:
    with tarfile.open(built[0]) as tar:
        names = {m.name.removeprefix(f"{DIST}/") for m in tar.getmembers() if m.isfile()}
    assert sorted(_package_files() - names) == []
    assert {"pyproject.toml", "README.md", "PKG-INFO"} <= names
    assert {n for n in names if n.split("/", 1)[0] in NOT_SHIPPED} == set()
    assert {n for n in names if "__pycache__" in n or n.endswith((".pyc", ".ckpt", ".tmp"))} == set()


#: run in the fresh environment: where fedrec comes from, what it needs and whether it has it
PROBE = textwrap.dedent("""
    import json, sys
    from importlib import metadata
    from packaging.requirements import Requirement
    import fedrec
    from fedrec.reproduce.papers import papers

    dist = metadata.distribution("fedrec")
    unmet = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{line} (have {have})")
    print(json.dumps({
        "fedrec": fedrec.__file__,
        "metadata": str(dist.locate_file("")),
        "direct_url": dist.read_text("direct_url.json"),
        "finders": [type(f).__module__ for f in sys.meta_path],
        "path": sys.path,
        "unmet": unmet,
        "papers": papers(),
    }))
""")


@pytest.fixture(scope="module")
def fresh(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed and this environment's packages
    visible as its dependencies."""
    env = tmp_path_factory.mktemp("venv") / "fresh"
    venv.EnvBuilder(with_pip=True, symlinks=os.name != "nt").create(env)
    python = env / "bin" / "python"
    _run([python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
          "--disable-pip-version-check", built[1]], env=_clean_env())
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   env=_clean_env()).stdout.strip()
    here = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(purelib) / "_outer_site_packages.pth").write_text("".join(f"{p}\n" for p in here))
    return env


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what could put the source tree on `sys.path`."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONNOUSERSITE": "1",
            **extra}


def test_installed_wheel_runs(fresh: Path, tmp_path: Path) -> None:
    env = _clean_env(FEDREC_HOME=str(tmp_path / "home"), FEDREC_CACHE=str(tmp_path / "cache"))
    probe = json.loads(_run([fresh / "bin" / "python", "-c", PROBE], cwd=tmp_path, env=env).stdout)
    assert Path(probe["fedrec"]).is_relative_to(fresh)
    assert Path(probe["metadata"]).is_relative_to(fresh)
    # pip records the wheel file it installed, never the checkout as an editable folder
    assert json.loads(probe["direct_url"]).get("archive_info") is not None
    assert not any("__editable__" in f for f in probe["finders"])
    assert not any(p and Path(p).resolve() in (ROOT, PACKAGE) for p in probe["path"])
    assert probe["unmet"] == []
    assert probe["papers"] == sorted(p.stem for p in FIGURES.glob("*.csv"))

    help_text = _run([fresh / "bin" / "fedrec", "--help"], cwd=tmp_path, env=env).stdout
    assert "run" in help_text and "Usage" in help_text
    # loo-full: 200 x 300 synthetic users can have fewer than the 99 unseen items that the
    # default loo-sampled protocol draws as evaluation negatives, and fedrec refuses such a split
    done = _run([fresh / "bin" / "fedrec", "run", "mf", "-d", "synthetic:200x300", "--epochs", "1",
                 "--protocol", "loo-full"], cwd=tmp_path, env=env)
    assert "ndcg@10" in done.stdout
    assert len(list((tmp_path / "runs").glob("mf-synthetic_200x300-*.json"))) == 1
