"""Packages are found, never listed by hand: a package left out of the wheel is a command a user cannot run.

setup.cfg holds the rest of the metadata; this file exists only because setup.cfg cannot both
find packages and map the ``cli/`` folder to ``wallaroo_proto_cli``.
"""

from setuptools import find_packages, setup

library = find_packages("src")
commands = [
    "wallaroo_proto_cli" + name.removeprefix("cli") for name in find_packages(include=["cli", "cli.*"])
]

setup(
    packages=library + commands,
    package_dir={"": "src", "wallaroo_proto_cli": "cli"},
)
