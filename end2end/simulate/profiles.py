"""The device profiles' public names (:mod:`end2end.simulate.cost.profiles`), kept at this path
for callers outside the simulator (autotune/spaces/bert_paper.py)."""

from end2end.simulate.cost.profiles import GB, PROFILES, DeviceProfile, get_profile

__all__ = ["GB", "PROFILES", "DeviceProfile", "get_profile"]
