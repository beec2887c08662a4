"""`dspark-obs dashboard`: the streamlit command line, its environment, and the checks before serving."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dspark_obs.cli import app
from dspark_obs.ui import serve as dashboard


def test_streamlit_command_is_headless_without_telemetry_and_passes_the_data_root(tmp_path):
    cmd = dashboard.streamlit_command(tmp_path, "127.0.0.1", 8600)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == dashboard.APP_PATH
    assert dashboard.APP_PATH.is_file()
    opts = dict(zip(cmd[5:cmd.index("--"):2], cmd[6:cmd.index("--"):2], strict=True))
    assert opts["--server.headless"] == "true" and opts["--browser.gatherUsageStats"] == "false"
    assert (opts["--server.address"], opts["--server.port"]) == ("127.0.0.1", "8600")
    assert opts["--client.showErrorDetails"] == "type"  # never a traceback, even for an uncaught error
    assert cmd[cmd.index("--"):] == ["--", "--data", str(tmp_path.resolve())]
    env = dashboard.streamlit_env(tmp_path)
    assert env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
    assert env["DSPARK_OBS_DATA"] == str(tmp_path.resolve())


def test_serve_dashboard_rejects_a_file_a_bad_port_and_a_busy_port(tmp_path):
    file = tmp_path / "store.parquet"
    file.write_text("")
    with pytest.raises(ValueError, match="is a file; pass the data root directory"):
        dashboard.serve_dashboard(file)
    with pytest.raises(ValueError, match="is not a TCP port"):
        dashboard.serve_dashboard(tmp_path, port=70000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=rf"127.0.0.1:{port} is already in use; pass another --port"):
            dashboard.serve_dashboard(tmp_path, "127.0.0.1", port)


def test_the_cli_command_has_help_and_fails_cleanly(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["dashboard", "--help"])
    assert result.exit_code == 0 and "--data" in result.output and "--port" in result.output
    file = tmp_path / "f"
    file.write_text("")
    result = runner.invoke(app, ["dashboard", "--data", str(file)])
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split())  # the console may wrap
