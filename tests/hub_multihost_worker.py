"""One process of a 2-process run that loads a model by Hub id; started by tests/test_hub.py.

argv: repo id. The environment carries COMPASSPLAY_* (distributed.from_env), HF_HOME and HF_ENDPOINT.
Prints one JSON line: this process's snapshot folder and the sum of each weight.
"""
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

from compassplay_jax.infra import distributed  # noqa: E402


def main():
  assert distributed.initialize()
  import jax
  import numpy as np
  from flax import nnx

  from compassplay_jax import load_model
  from compassplay_jax.models import hub

  folder = hub.resolve_checkpoint(sys.argv[1])
  model, _ = load_model(sys.argv[1], with_tokenizer=False)
  sums = [float(np.asarray(x, np.float64).sum()) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
  print(json.dumps({"process": jax.process_index(), "folder": str(folder), "sums": sums}), flush=True)


if __name__ == "__main__":
  main()
