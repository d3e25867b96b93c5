"""A Mesh-TensorFlow mesh shape and layout rules, parsed by mesh-tensorflow and checked.

A layout is what Mesh-TensorFlow users write (Shazeer et al., "Mesh-TensorFlow: Deep Learning
for Supercomputers", 2018): a mesh shape such as ``"b1:2;b2:2"`` (named mesh dimensions and
their sizes, ``b1 x b2`` devices) and layout rules such as ``"batch:b1;hidden:b2"`` (which
tensor dimension is split over which mesh dimension). Both strings are parsed by
mesh-tensorflow's own ``convert_to_shape`` and ``convert_to_layout_rules``; :class:`MeshLayout`
adds the checks that name what is wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tensorfleet.compat.mesh_tf import import_mesh_tensorflow, layout_pairs

__all__ = ["MeshLayout"]


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """A Mesh-TF mesh shape and layout rules, parsed and checked.

    Args:
        mesh_shape: e.g. ``"b1:2;b2:2"``.
        layout: e.g. ``"batch:b1;hidden:b2"``; may be empty (everything replicated).

    Raises:
        ValueError: a string Mesh-TF cannot parse, a mesh dimension that is not positive, or
            a rule that names a mesh dimension the mesh does not have.

    Example:
        >>> layout = MeshLayout("b1:2;b2:2", "batch:b1;hidden:b2")
        >>> layout.mesh_dims, layout.rules, layout.size
        ({'b1': 2, 'b2': 2}, {'batch': 'b1', 'hidden': 'b2'}, 4)
    """

    mesh_shape: str
    layout: str = ""
    _shape: Any = dataclasses.field(init=False, repr=False, compare=False)  # the parsed mtf.Shape
    _rules: Any = dataclasses.field(init=False, repr=False, compare=False)  # the parsed mtf.LayoutRules

    def __post_init__(self) -> None:
        if not isinstance(self.mesh_shape, str) or not self.mesh_shape.strip():
            raise ValueError('mesh_shape must be a non-empty string such as "b1:2;b2:2". '
                             f"Received: mesh_shape={self.mesh_shape!r}")
        if not isinstance(self.layout, str):
            raise ValueError(f'layout must be a string such as "batch:b1;hidden:b2". Received: layout={self.layout!r}')
        mtf = import_mesh_tensorflow()
        try:
            shape = mtf.convert_to_shape(self.mesh_shape)
        except Exception as exc:  # mesh-tensorflow raises bare ValueErrors without the input
            raise ValueError(f'mesh_shape must look like "b1:2;b2:2" (name:size pairs separated by ";"). '
                             f"Received: mesh_shape={self.mesh_shape!r} ({exc})") from None
        try:
            rules = mtf.convert_to_layout_rules(self.layout)
        except Exception as exc:
            raise ValueError('layout must look like "batch:b1;hidden:b2" (tensor_dim:mesh_dim pairs separated by '
                             '";"). '
                             f"Received: layout={self.layout!r} ({exc})") from None
        for dim in shape.dims:
            if dim.size <= 0:
                raise ValueError(f"Mesh dimension {dim.name!r} must have a positive size. Received: "
                                 f"mesh_shape={self.mesh_shape!r}")
        names = [d.name for d in shape.dims]
        pairs = layout_pairs(rules)
        for tensor_dim, mesh_dim in pairs:
            if [t for t, _ in pairs].count(tensor_dim) > 1:
                raise ValueError(f"Tensor dimension {tensor_dim!r} is laid out on more than one mesh dimension. "
                                 f"Received: layout={self.layout!r}")
            if mesh_dim not in names:
                raise ValueError(
                    f"Layout rule '{tensor_dim}:{mesh_dim}' names mesh dimension {mesh_dim!r}, which the mesh has not; "
                    f"mesh dimensions: {', '.join(names)}. Received: mesh_shape={self.mesh_shape!r}, "
                    f"layout={self.layout!r}")
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_rules", rules)

    @property
    def mtf_shape(self) -> Any:
        """The ``mtf.Shape`` of the mesh."""
        return self._shape

    @property
    def mtf_rules(self) -> Any:
        """The ``mtf.LayoutRules``."""
        return self._rules

    @property
    def mesh_dims(self) -> dict[str, int]:
        """Mesh dimension name -> size, in mesh order."""
        return {d.name: d.size for d in self.mtf_shape.dims}

    @property
    def rules(self) -> dict[str, str]:
        """Tensor dimension name -> mesh dimension name."""
        return dict(layout_pairs(self.mtf_rules))

    @property
    def size(self) -> int:
        """Number of devices the mesh needs."""
        return int(self.mtf_shape.size)

    def check(self, dims: Mapping[str, int], num_devices: int) -> None:
        """Checks the layout against a model's tensor dimensions and the devices at hand.

        Args:
            dims: tensor dimension name -> size (:func:`model_dimensions`).
            num_devices: devices available.

        Raises:
            ValueError: a rule names a tensor dimension the model has not, a mesh dimension
                does not divide the tensor dimension laid out on it, or the mesh needs more
                devices than there are.
        """
        if self.size > num_devices:
            raise ValueError(f"The mesh {self.mesh_shape!r} needs {self.size} devices but only {num_devices} are "
                             f"available; use a smaller mesh or more devices. Received: mesh_shape={self.mesh_shape!r}")
        for tensor_dim, mesh_dim in self.rules.items():
            if tensor_dim not in dims:
                raise ValueError(
                    f"Layout rule '{tensor_dim}:{mesh_dim}' names tensor dimension {tensor_dim!r}, which the model has "
                    f"not; its dimensions are: {', '.join(sorted(dims))}. Received: layout={self.layout!r}")
            size, parts = dims[tensor_dim], self.mesh_dims[mesh_dim]
            if size % parts != 0:
                raise ValueError(
                    f"Mesh dimension {mesh_dim!r} of size {parts} does not divide tensor dimension {tensor_dim!r} of "
                    f"size {size}; choose a mesh size that divides {size}. Received: mesh_shape={self.mesh_shape!r}, "
                    f"layout={self.layout!r}")

    def coordinates(self, pnum: int) -> dict[str, int]:
        """Mesh coordinates of processor ``pnum`` (row-major, as PlacementMeshImpl numbers them)."""
        coords, rest = {}, pnum
        for name, size in reversed(list(self.mesh_dims.items())):
            coords[name], rest = rest % size, rest // size
        return dict(reversed(list(coords.items())))
