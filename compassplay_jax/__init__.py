"""CompassPlay-JAX: gradient-aligned self-play for LLMs in JAX."""

__version__ = "0.1.0"


def load_model(path="smollm2-135m", **kwargs):
  """Loads (model, tokenizer) from a Hugging Face directory, a GGUF file or the embedded default.

  See `compassplay_jax.models.loading.load_model` for the arguments.
  """
  from compassplay_jax.models.loading import load_model as _load_model
  return _load_model(path, **kwargs)


__all__ = ["load_model", "__version__"]
