"""Where the model's activations lie on a device mesh: rows over the mesh's batch axes.

The model knows no mesh. Code that compiles it for one (sharding.jit) traces it with that mesh as
JAX's abstract mesh in context; `constrain_rows` then pins the embeddings' rows to the batch axes in
passes over whole sequences. Without the pin, XLA's sharding propagation can take the layout of the
embedding table instead (hidden dim over `fsdp`, sharding.PARAM_RULES): under FSDP every device then
holds every row of the micro-batch on its slice of the hidden dim and all-reduces the activations
and the full (B, T, V) logits (g_ref ~4x slower on 8 simulated devices; the paper's train micro-batch
3x the link bytes on TPU). A decode step (one token a row) is not pinned: there moving the few
activations beats gathering the weights every step (docs/sharding.md, "Rows stay on their devices").
"""
from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec as P

# The mesh axes a batch's rows are split over (sharding.BATCH_AXES is this tuple).
BATCH_AXES = ("data", "fsdp")


def constrain_rows(x: jax.Array) -> jax.Array:
  """x with its leading dimension split over the batch axes of the mesh in context; x unchanged when
  no mesh is in context (eager code), the batch axes have one device, or the rows do not divide evenly
  over them."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not all(a in mesh.axis_names for a in BATCH_AXES):
    return x
  split = math.prod(mesh.shape[a] for a in BATCH_AXES)
  if split == 1 or x.shape[0] % split:  # nothing to split, or rows that do not divide evenly
    return x
  return jax.lax.with_sharding_constraint(x, P(BATCH_AXES))
