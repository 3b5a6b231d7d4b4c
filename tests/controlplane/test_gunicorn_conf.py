"""gunicorn's settings as gunicorn itself reads them from gunicorn.conf.py (in a child: the file sets the umask)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ = """
import json, sys
from gunicorn.config import Config
from gunicorn.app.base import Application
class Read(Application):
    def init(self, *args): return {}
    def load(self): return None
app = Read.__new__(Read)
app.cfg = Config()
app.load_config_from_file(sys.argv[1])
print(json.dumps({"path": app.cfg.control_socket, "mode": app.cfg.control_socket_mode,
                  "off": app.cfg.control_socket_disable}))
"""


def control_socket(home: Path) -> dict:
    env = {**os.environ, "FLIGHTDECK_HOME": str(home)}
    env.pop("XDG_RUNTIME_DIR", None)
    done = subprocess.run([sys.executable, "-c", READ, str(ROOT / "gunicorn.conf.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_each_home_has_its_own_control_socket_never_the_users_shared_default(tmp_path: Path) -> None:
    a, b = control_socket(tmp_path / "a"), control_socket(tmp_path / "b")
    assert a == {"path": str(tmp_path / "a" / "gunicorn.ctl"), "mode": 0o600, "off": False}
    assert b["path"] == str(tmp_path / "b" / "gunicorn.ctl")


def test_a_home_too_deep_for_a_unix_socket_gets_none(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    assert control_socket(deep)["off"] is True
