"""Issue 34 (third audit), rows 2, 4, 7, 8 and 9: each test failed on the main of before the fix.

* row 2: ``--backend ray`` refuses to start a local instance on a Ray that does not enforce token
  authentication (< 2.52), before Ray is imported or the environment touched;
* row 4: ``attach``'s ELF reader refuses a file whose headers claim more than it holds or a budget allows;
* row 7: no string of a report.json becomes live Markdown (or HTML): a fuzz over every string field;
* row 8: the readers' budgets count what records cost in memory, not only bytes on disk;
* row 9: the patient's strings reach the terminal through one sanitiser.
"""

from __future__ import annotations

import os

import pytest

from gpudoctor.common.errors import UserError

# -- row 2: Ray's token authentication -------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.9.0", "2.51.1", "2.51.2", "not-a-version"])
def test_a_local_ray_instance_is_refused_on_a_ray_that_ignores_its_token(monkeypatch, version):
    from gpudoctor.sweep import ray_backend

    monkeypatch.setattr(ray_backend, "installed_ray_version", lambda: version)

    def no_ray() -> None:
        raise AssertionError("Ray imported before the version was checked")

    monkeypatch.setattr(ray_backend, "_import_ray", no_ray)
    env_before = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
    with pytest.raises(UserError) as err:
        ray_backend.RayBackend(None)
    message = str(err.value)
    assert "\n" not in message and "2.52" in message and "token" in message, message
    assert version in message
    after = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
    assert after == env_before  # refused before the token was made


@pytest.mark.parametrize("version", ["2.52.0", "2.60.0", "2.52.0rc1", "3.0.0.dev0"])
def test_a_ray_that_enforces_the_token_passes_the_check(version):
    from gpudoctor.sweep import ray_backend

    ray_backend.require_token_auth(version)  # no error


def test_the_ray_extra_asks_for_the_ray_that_enforces_the_token():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from tests.conftest import ROOT

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["ray"] == ["ray>=2.52"]
