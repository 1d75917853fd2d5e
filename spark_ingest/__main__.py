"""The ``outbox`` CLI as a file spark-submit can run, and as ``python -m spark_ingest``.

spark-submit runs a Python application from a file, not a console script::

    spark-submit --master spark://host:7077 --jars postgresql.jar \\
        "$(python -c 'import spark_ingest.__main__ as m; print(m.__file__)')" \\
        reconcile --outbox jdbc:postgresql://db:5432/app ...

The session then keeps spark-submit's master and jars (see ``_session.spark_session``).
"""

from __future__ import annotations

import sys
from pathlib import Path


def run() -> None:
    # Run as a file, this directory comes first on sys.path: drop it, or its modules (cli,
    # _config, ...) would shadow top-level modules of the same name.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    from outbox.cli import main

    main(prog_name="outbox")


if __name__ == "__main__":
    run()
