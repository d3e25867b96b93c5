"""LARS and LAMB: layer-wise adaptive optimizers for large global batches, for the Keras that lacks them.

- LARS, You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks"
  (arXiv:1708.03888), Algorithm 1. For each weight tensor ``w`` with gradient ``g``, learning rate
  ``lr``, momentum ``mu``, trust coefficient ``eta`` and weight decay ``wd``::

      local_lr = eta * ||w|| / (||g|| + wd * ||w||)      (1 when ||w|| or ||g|| is 0)
      v = mu * v + lr * local_lr * (g + wd * w)
      w = w - v

- LAMB, You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"
  (arXiv:1904.00962), Algorithm 2 with phi the identity, at step ``t`` (from 1)::

      m = b1 * m + (1 - b1) * g ;  v = b2 * v + (1 - b2) * g**2
      r = (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps) + wd * w
      w = w - lr * ||w|| / ||r|| * r                      (ratio 1 when ||w|| or ||r|| is 0)

As the papers and their common implementations do, biases and normalization parameters (every
variable of rank 0 or 1) are excluded from the adaptation and from the weight decay: LARS steps them
with plain momentum SGD (``v = mu * v + lr * g``), LAMB with bias-corrected Adam.

Which Keras has which: Keras 3 ships ``keras.optimizers.Lamb`` (3.15.1), and :func:`lamb` returns it
for a Keras 3 model (its weight decay is Keras's decoupled one, ``w -= lr * wd * w`` before the step,
and its trust ratio applies to every variable); neither Keras ships LARS, and tf_keras (2.21) has no
LAMB: those are the classes here, subclasses of each Keras's own ``Optimizer`` (``build`` /
``update_step``). Their ``weight_decay`` is the papers' (inside the trust ratio), not Keras's decoupled
one.

The classes subclass each Keras's protected optimizer API, so they live in
:mod:`tensorfleet.compat.layerwise`; these are the public names. Importing this module registers them with
the Kerases the process uses (as ``tensorfleet>LARS``, ``tensorfleet>LAMB``): a model saved compiled with them
loads with plain ``keras.saving.load_model`` (or tf_keras's) in a process that imported it, no ``custom_objects``.

Example:
    >>> import keras
    >>> opt = lars(learning_rate=0.1, keras="keras3")
    >>> isinstance(opt, keras.optimizers.Optimizer), opt.get_config()["eta"]
    (True, 0.001)
    >>> type(lamb(keras="keras3")).__name__
    'Lamb'
"""

from tensorfleet.compat.layerwise import (
    NAMES,
    lamb,
    lamb_update,
    lars,
    lars_update,
    optimizer_class,
    register_serializable,
)

__all__ = ["NAMES", "lamb", "lamb_update", "lars", "lars_update", "optimizer_class", "register_serializable"]

register_serializable()
