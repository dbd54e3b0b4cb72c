"""Execute ``notebooks/debugging.ipynb`` with nbclient, in a kernel of *this* interpreter.

The kernel spec is written to a temporary directory and points at :data:`sys.executable`,
so the notebook runs with the packages of the environment running the tests (a fresh
``pip install -e .[dev]`` is enough: no ``jupyter kernelspec install``, no ``python3`` on
PATH needed). The kernel inherits the environment, in particular ``AGGBOX_MONGODB_URI``.

Regenerate the committed outputs after changing the notebook::

    .venv/bin/python -m tests.docs.notebook --write

(against ``AGGBOX_MONGODB_URI`` if set, else a local server started for the run).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "debugging.ipynb"
KERNEL_NAME = "aggbox-tests"
#: The kernel spec stored in the notebook (what a reader's Jupyter uses).
READER_KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                     "language": "python"}


def read_notebook(path: Path = NOTEBOOK) -> Any:
    return nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]


def kernel_manager(spec_root: Path, ipc_dir: Path) -> KernelManager:
    """A kernel manager whose only kernel spec runs ``sys.executable -m ipykernel_launcher``;
    the kernel talks over Unix sockets in ``ipc_dir`` (no TCP ports, no warning about
    unencrypted TCP; keep the path short: socket paths are limited to about 100 bytes)."""
    spec_dir = spec_root / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"aggbox tests ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    specs = KernelSpecManager(kernel_dirs=[str(spec_root / "kernels")])
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs, transport="ipc",
                         ip=str(ipc_dir / "k"))


def execute(path: Path = NOTEBOOK, *, workdir: Path, timeout: float = 300) -> Any:
    """Run every cell in order and return the executed notebook (``nbformat`` node).

    Raises ``nbclient.exceptions.CellExecutionError`` (with the cell's source and traceback)
    when a cell fails. The kernel's working directory is ``workdir``."""
    nb = read_notebook(path)
    with tempfile.TemporaryDirectory(prefix="agx-") as ipc_dir:
        km = kernel_manager(workdir / "kernelspec", Path(ipc_dir))
        client = NotebookClient(nb, km=km, timeout=timeout, startup_timeout=120,
                                record_timing=False, allow_errors=False,
                                resources={"metadata": {"path": str(workdir)}})
        client.execute()
        del client, km
        # Collect the kernel client now: collected at interpreter exit, its __del__ logs to
        # already-closed streams and prints a logging traceback after pytest's summary.
        gc.collect()
    nb.metadata["kernelspec"] = dict(READER_KERNELSPEC)
    return nb


def code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


def output_text(cell: Any) -> str:
    """Everything a code cell showed, as text (streams, plain text and HTML of results)."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            for mime in ("text/plain", "text/html"):
                if mime in out.data:
                    parts.append(str(out.data[mime]))
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute notebooks/debugging.ipynb.")
    parser.add_argument("--write", action="store_true",
                        help="store the executed notebook (with outputs) in place")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aggbox-nb-") as tmp:
        nb = execute(workdir=Path(tmp))
    if args.write:
        nbformat.write(nb, NOTEBOOK)  # type: ignore[no-untyped-call]
        print(f"wrote {NOTEBOOK}")
    else:
        print(f"{NOTEBOOK.name}: {len(code_cells(nb))} code cells ran without error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
