"""Build libh3 with make before the wheel (or the editable install) is assembled."""

import subprocess

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        subprocess.check_call(["make", "-C", self.root, "lib"])
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
