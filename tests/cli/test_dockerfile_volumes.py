"""The image holds every compose volume's mount point, owned by the user the processes run as."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_volume_mount_points_exist_in_the_image_owned_by_its_user() -> None:
    # Docker initialises a new named volume from the image's directory at the mount point (owner included);
    # without one the volume's root is root's, and the non-root processes cannot write their data dirs.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    targets = {v.split(":")[1] for s in compose["services"].values() for v in s.get("volumes", [])}
    assert targets
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    made: set[str] = set()
    owned: list[str] = []
    for line in re.findall(r"^RUN (.+)$", text, re.M):
        for command in re.split(r"&&|;", line):
            words = shlex.split(command)
            if words[:2] == ["mkdir", "-p"]:
                made.update(words[2:])
            elif words[:2] == ["chown", "-R"] and words[2] == user:
                owned += words[3:]
    assert targets <= made, f"mount points missing from the image: {sorted(targets - made)}"
    for target in targets:
        assert any(target == o or target.startswith(o.rstrip("/") + "/") for o in owned), f"{target} not chowned"
