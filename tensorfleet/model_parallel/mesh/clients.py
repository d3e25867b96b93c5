"""A mesh over the devices of several processes: DTensor's multi-client mode.

TensorFlow's DTensor forms one mesh over the devices of several processes (its *clients*) when each
process is told the cluster by four environment variables, TensorFlow's own contract (set by hand on machines of your
own):

* ``DTENSOR_JOBS``: every client's ``host:port``, comma-separated, in client order;
* ``DTENSOR_CLIENT_ID``: this process's index in that list;
* ``DTENSOR_NUM_CLIENTS``: how many clients;
* ``DTENSOR_JOB_NAME``: the job's name in the device names (``worker``).

``tensorfleet launch --mesh`` (and a Kubernetes TFJob with the variable in its manifest) sets
:data:`ENV_ACROSS` beside each task's ``TF_CONFIG`` instead: the mesh then takes the workers of
``TF_CONFIG`` as its clients (:func:`env_from_tf_config`), at the ports the launcher picked.

With ``DTENSOR_JOBS`` set, :class:`~tensorfleet.model_parallel.mesh.Mesh` builds its DTensor mesh
with :func:`distributed_mesh`: it starts DTensor's runtime in this process
(``dtensor.initialize_accelerator_system``, which must run before TensorFlow's runtime starts: a
Mesh made before any tensor), each process with its share of the mesh's devices (on a machine
without accelerators, that many logical CPUs), then ``dtensor.create_distributed_mesh``: one mesh of
``mesh.size`` devices, the first dimension of the layout across the processes (device ``i`` is local
device ``i mod local`` of client ``i // local``, so with ``"b:2;m:2"`` over two processes each
process holds one ``b`` row, both ``m`` shards of it). Every process runs the same script with
the same data; each step is one program over all devices, its collectives crossing the processes
through TensorFlow's distributed runtime. Without ``DTENSOR_JOBS`` the mesh is local, as before.

Measured (TensorFlow 2.21, 2 processes x 2 logical CPUs on 127.0.0.1): see
docs/how-to-run-a-mesh-across-processes.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["ENV_ACROSS", "ENV_JOBS", "dtensor_env", "env_from_tf_config", "distributed_mesh", "global_devices",
           "is_multi_client", "local_share", "split_cpu"]

#: Set to ``1`` by ``tensorfleet launch --mesh`` (or a Kubernetes TFJob's manifest): the mesh spans the workers
#: of ``TF_CONFIG``, DTensor's environment set from it (:func:`env_from_tf_config`).
ENV_ACROSS = "TENSORFLEET_MESH_ACROSS_PROCESSES"
ENV_JOBS, ENV_CLIENT_ID, ENV_NUM_CLIENTS, ENV_JOB_NAME = (
    "DTENSOR_JOBS", "DTENSOR_CLIENT_ID", "DTENSOR_NUM_CLIENTS", "DTENSOR_JOB_NAME")
JOB_NAME = "worker"


def dtensor_env(addresses: list[str], client: int) -> dict[str, str]:
    """The DTensor environment of client ``client`` of the clients at ``addresses`` (``host:port`` each)."""
    return {ENV_JOBS: ",".join(addresses), ENV_CLIENT_ID: str(client), ENV_NUM_CLIENTS: str(len(addresses)),
            ENV_JOB_NAME: JOB_NAME}


def is_multi_client() -> bool:
    """Whether this process is one client of a multi-client DTensor job: ``DTENSOR_JOBS`` set, or
    :data:`ENV_ACROSS` and ``TF_CONFIG`` (then DTensor's environment is set from them here, once)."""
    if not os.environ.get(ENV_JOBS, "").strip() and os.environ.get(ENV_ACROSS, "") == "1":
        os.environ.update(env_from_tf_config(os.environ.get("TF_CONFIG", "")))
    return bool(os.environ.get(ENV_JOBS, "").strip())


def env_from_tf_config(raw: str) -> dict[str, str]:
    """DTensor's environment of the task that ``TF_CONFIG`` (``raw``) describes: its workers are the clients, in
    order, at their addresses; this task is client ``task.index``. One clear error for a TF_CONFIG of another
    shape (a chief, parameter servers, an evaluator: a mesh's processes are workers alike)."""
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        workers, role, index = list(cluster["worker"]), task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{ENV_ACROSS}=1 makes a mesh across the workers TF_CONFIG names, but TF_CONFIG does not "
                         f"name them and this task ({{\"cluster\": {{\"worker\": [...]}}, \"task\": {{\"type\": "
                         f"\"worker\", \"index\": i}}}}). Received: TF_CONFIG={raw!r}") from None
    others = sorted(set(cluster) - {"worker"})
    if role != "worker" or others:
        raise ValueError(f"A mesh across processes has workers only (each a DTensor client); TF_CONFIG names "
                         f"{', '.join(others) or role}. Received: task {role}:{index}, cluster {sorted(cluster)}")
    return dtensor_env(workers, index)


def local_share(size: int, mesh_shape: str) -> int:
    """How many of a mesh's ``size`` devices each client holds; one clear error when they do not divide."""
    jobs = [j for j in os.environ.get(ENV_JOBS, "").split(",") if j.strip()]
    clients = len(jobs)
    if size % clients:
        raise ValueError(f"A mesh across {clients} processes (DTENSOR_JOBS={','.join(jobs)}) needs a size that "
                         f"they divide, each process holding as many of its devices; use a mesh of a multiple of "
                         f"{clients} devices, or launch {clients} processes that divide it. Received: "
                         f"mesh_shape={mesh_shape!r} of {size} devices")
    return size // clients


def distributed_mesh(mesh_dims: dict[str, int], mesh_shape: str) -> Any:
    """The DTensor mesh ``mesh_dims`` over the devices of every client, DTensor's runtime started here first
    (each client with its share of the devices; see the module)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    size = 1
    for n in mesh_dims.values():
        size *= n
    local = local_share(size, mesh_shape)
    device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    if not _initialized():
        try:
            dtensor.initialize_accelerator_system(
                device_type, num_logical_cpu_devices=local if device_type == "CPU" else None)
        except ValueError as exc:
            raise RuntimeError(
                f"A mesh across processes starts DTensor's runtime, which must come before TensorFlow's: make the "
                f"Mesh (and enter its scope) before any tensor, model or device query of the script ({exc})") from None
    available = dtensor.num_local_devices(device_type)
    if available < local:
        raise ValueError(f"The mesh {mesh_shape!r} needs {local} {device_type} devices in each of its "
                         f"{dtensor.num_clients()} processes but this one has {available}. Received: "
                         f"mesh_shape={mesh_shape!r}")
    devices = [f"{device_type}:{i}" for i in range(local)]
    return dtensor.create_distributed_mesh(list(mesh_dims.items()), local_devices=devices, device_type=device_type)


def global_devices(dmesh: Any) -> list[str]:
    """The names of a mesh's devices across the processes, in mesh order (device ``i`` is local device
    ``i mod local`` of process ``i // local``)."""
    from tensorflow.experimental import dtensor

    local, kind = dmesh.num_local_devices(), dmesh.device_type()
    return [f"/job:{dtensor.job_name()}/replica:0/task:{i // local}/device:{kind}:{i % local}"
            for i in range(dmesh.size)]


def split_cpu(n: int) -> None:
    """On a machine without GPUs whose CPU TensorFlow has not split yet (its runtime not started), ``n`` logical
    CPUs: the devices a mesh of ``n`` needs in this one process. Anything else is left as it is."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")
    if tf.config.list_physical_devices("GPU") or not cpu or tf.config.get_logical_device_configuration(cpu[0]):
        return
    try:
        tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:  # the runtime has started: its devices are what they are
        pass


def _initialized() -> bool:
    from tensorfleet.compat.dtensor import accelerator_initialized

    return accelerator_initialized()
