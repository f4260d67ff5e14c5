"""`libra run --ray` options without engines: the `ray:` config key and the one-line errors of the CLI (Ray
missing, a malformed or unreachable address), given before anything is built or written."""

from __future__ import annotations

import sys

import pytest

from libra.cli import main
from libra.runtime import RunConfigError, config_from_dict
from libra.runtime.config import RaySettings


def test_ray_key_selects_the_backend_and_rejects_nonsense() -> None:
    assert config_from_dict({}).ray is None  # local processes by default
    assert config_from_dict({"ray": None}).ray is None
    assert config_from_dict({"ray": {}}).ray == RaySettings(address="local")
    assert config_from_dict({"ray": {"address": "auto"}}).ray.address == "auto"
    assert config_from_dict({"ray": {"address": "10.0.0.2:6379"}}).to_dict()["ray"] == {"address": "10.0.0.2:6379"}
    with pytest.raises(RunConfigError, match="ray.address"):
        config_from_dict({"ray": {"address": " "}})
    with pytest.raises(RunConfigError, match=r"ray\.adress"):
        config_from_dict({"ray": {"adress": "auto"}})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray-address", "127.0.0.1:1"], "cannot reach the Ray cluster at '127.0.0.1:1'"),
        (["--ray-address", "nowhere"], "is not 'auto', 'local', 'host:port'"),
        (["--ray-address", ""], "ray.address must be"),
    ],
)
def test_bad_ray_address_is_one_line_before_anything_is_written(tmp_path, capsys, args, message) -> None:
    out = tmp_path / "run"
    assert main(["run", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("libra: error:") and message in err and "\n" not in err, err
    assert not out.exists()


def test_missing_ray_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    assert main(["run", "--ray", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "libra: error: --ray needs Ray, which is not installed here (pip install 'libra[ray]')", err
