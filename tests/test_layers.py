"""The package's layers import one way (data -> protocols -> eval -> core -> models -> a
round's parts -> engine -> training -> methods -> security -> deployment -> studies -> CLI), and
no modules import each other in a circle. The layers are the import-linter contract in
pyproject.toml. The circles are found in its import graph, where a module-level, a
function-level and a type-only import all count (the contract does not count a type-only one).
The contract's ``ignore_imports`` are known exceptions, the same for both checks."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_layers_import_one_way() -> None:
    # in a process of its own: import-linter's command configures logging, which would disable
    # the loggers of every module the test session has imported
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, no_logo=True))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def test_no_import_circles() -> None:
    import grimp
    import networkx as nx

    settings = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    ignored = {tuple(part.strip() for part in rule.split("->"))
               for contract in settings["contracts"] for rule in contract.get("ignore_imports", [])}
    # a type-only import counts here: a module that names its builder for a type is in a circle
    graph = grimp.build_graph("fedrec", cache_dir=None, exclude_type_checking_imports=False)
    imports = nx.DiGraph((m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)
                         if (m, i) not in ignored)
    circles = [c for c in nx.strongly_connected_components(imports) if len(c) > 1]
    assert not circles, f"modules importing each other in a circle: {sorted(sorted(c) for c in circles)}"
