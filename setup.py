"""CompassPlay-JAX: gradient-aligned self-play for LLMs, in JAX."""
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent


def _requirements(name):
  lines = (HERE / name).read_text().splitlines()
  return [l.strip() for l in lines if l.strip() and not l.startswith(("#", "-r"))]


setup(
    name="compassplay-jax",
    version="0.1.0",
    description="Reference JAX implementation of gradient-aligned self-play for LLMs",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["compassplay_jax", "compassplay_jax.*"]),
    # compassplay_jax/data is a package (the fetch command) that also ships the built-in reference set
    # and the demo's seed programs.
    package_data={"compassplay_jax": ["data/*.jsonl", "data/*.md", "data/demo_seed/*.jsonl"],
                  "compassplay_jax.cli.data": ["*.jsonl", "*.md", "demo_seed/*.jsonl"]},
    install_requires=_requirements("requirements.txt"),
    extras_require={"test": _requirements("requirements-test.txt")},
)
