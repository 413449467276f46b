"""The tf.data input pipeline: tokenizers, sources, pre-training examples, masking, task data.

TensorFlow is used for tf.data and tf.text only. Entry points call `hide_accelerators_from_tf()`
before any TF work so TF never takes GPU/TPU memory that JAX needs.
"""


def hide_accelerators_from_tf() -> None:
    """Makes TF see only the CPU. Call once at start-up, before TF touches a device. Without TensorFlow
    installed (a bare GPU machine running the synthetic-data trainer) there is nothing to hide."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        return
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
        tf.config.set_visible_devices([], "TPU")
    except (RuntimeError, ValueError):  # already initialised, or no such device type
        pass
