"""The simulator's layers (end2end/simulate/__init__.py): the cost layer reads a ``cpu``
calibration file but never measures one (that is the calibration layer's, for the commands), and
the public names kept at the package's top are the cost layer's own."""

import pytest

from slapo.errors import ConfigError


def test_the_cost_layer_reads_but_never_measures_the_cpu_profile(tmp_path):
    from end2end.simulate.cost.profiles import get_profile

    missing = tmp_path / "none.json"
    with pytest.raises(ConfigError, match="no cpu calibration at") as err:
        get_profile("cpu", str(missing))
    assert "python -m end2end.simulate.calibrate --out" in err.value.hint
    assert not missing.exists()
    with pytest.raises(ConfigError, match="unknown device profile 'v99'"):
        get_profile("v99")


def test_commands_get_gpu_profiles_from_the_table_and_public_names_are_the_same():
    from end2end.simulate import profiles
    from end2end.simulate.calibration.cpu import device_profile
    from end2end.simulate.cost import profiles as cost_profiles

    assert device_profile("v100-32gb") is cost_profiles.PROFILES["v100-32gb"]
    assert profiles.get_profile is cost_profiles.get_profile
    assert profiles.PROFILES is cost_profiles.PROFILES
