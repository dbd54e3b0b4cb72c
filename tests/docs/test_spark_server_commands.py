"""docs/operations.md "Starting Spark from pip's PySpark" shows exactly the commands the
suite's fixtures run (tests/spark/servers.py builds them with ``master_command``,
``worker_command`` and ``connect_command``; the fixtures only add test settings after them),
and sets ``PYSPARK_PYTHON`` — not ``spark.pyspark.python`` — for the servers' Python."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.docs.markdown import fenced_blocks
from tests.spark.servers import connect_command, master_command, worker_command

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _documented() -> tuple[str, list[list[str]]]:
    (block,) = [b for b in fenced_blocks(PAGE)
                if b.language == "bash" and "SparkConnectServer" in b.source]
    text = block.source.replace("\\\n", " ")
    commands = [shlex.split(line) for line in text.splitlines()
                if line.startswith('"$SPARK_HOME/bin/')]
    return block.source, commands


def test_the_page_shows_the_fixtures_commands() -> None:
    source, commands = _documented()
    home = "$SPARK_HOME"
    assert commands == [
        master_command(home, 7077, 8080),
        worker_command(home, "spark://127.0.0.1:7077", 2, "2g", 8081),
        connect_command(home, "local[*, 4]", 15002, "$KAFKA_JARS"),
    ]
    assert ("SPARK_HOME=$(python -c 'import pyspark,os;print(os.path.dirname("
            "pyspark.__file__))')") in source
    assert "export PYSPARK_PYTHON=" in source
    assert "spark.pyspark.python" not in source
