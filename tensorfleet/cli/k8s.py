"""``tensorfleet k8s``: Kubernetes manifests for training (a Kubeflow TFJob), TFF workers, a tuning
search and a served model, each checked against the Kubernetes schemas before it is written.

Example:
    $ tensorfleet k8s tfjob --name digits --image registry.example/train:1 --workers 2 \\
        --command "python train.py --epochs 6" --output digits.yaml
    $ tensorfleet k8s validate digits.yaml
    $ tensorfleet k8s tf-config digits.yaml --role worker --index 1
    $ tensorfleet k8s serving --name digits --image registry.example/digits:1 --min-replicas 2 \\
        --max-replicas 6 -o serving.yaml -- --enable-batching
"""

from __future__ import annotations

import contextlib
import json
import shlex
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer

from tensorfleet.cli.tune import k8s_tune_command

__all__ = ["NAME", "app", "serving_command"]

NAME = "k8s"

app = typer.Typer(name=NAME, help="Kubernetes manifests: TFJob, TFF workers, tuning, serving.", no_args_is_help=True)


def _read_manifest(path: Path) -> list[dict]:
    from tensorfleet import kube
    from tensorfleet.io import read_text

    return kube.load_yaml(read_text(path, "a YAML manifest (Kubernetes objects)", empty=True))


@contextlib.contextmanager
def _about(path: Path) -> Iterator[None]:
    """What is wrong with the manifest at ``path`` (not YAML, empty, against a schema), said with its name."""
    from tensorfleet.kube import ManifestError

    try:
        yield
    except ManifestError as error:
        raise ManifestError(f"{str(path)!r}: {error}") from None


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env takes KEY=VALUE. Received: --env {pair!r}")
        env[key] = value
    return env


def _emit(docs: list[dict], out_path: Optional[Path], write: Callable[..., Any], what: str) -> None:  # noqa: UP007
    """The manifest as YAML on stdout, or written (checked by ``write``) to ``out_path`` with a line on stderr."""
    from tensorfleet import kube

    if out_path is None:
        typer.echo(kube.dump_yaml(docs), nl=False)
    else:
        write(docs, out_path)
        typer.echo(f"wrote {out_path} ({what}), valid against Kubernetes {kube.KUBERNETES_VERSION}", err=True)


@app.command("tfjob", context_settings={"allow_interspersed_args": False})
def tfjob_command(
    args: Optional[List[str]] = typer.Argument(  # noqa: UP006,UP007
        None, help="The trainer's command, after '--' (or use --command)."),
    name: str = typer.Option(..., "--name", help="Job name (a DNS label)."),
    image: str = typer.Option(..., "--image", help="Container image with the script and tensorfleet."),
    workers: int = typer.Option(..., "--workers", help="Worker replicas."),
    ps: int = typer.Option(0, "--ps", help="Parameter-server replicas (adds a chief)."),
    chief: bool = typer.Option(False, "--chief", help="Add a Chief replica."),
    evaluator: bool = typer.Option(False, "--evaluator", help="Add an Evaluator replica."),
    command: Optional[str] = typer.Option(  # noqa: UP007
        None, "--command", help="The trainer's command as one shell-quoted string."),
    namespace: str = typer.Option("default", "--namespace"),
    restart_policy: str = typer.Option("OnFailure", "--restart-policy", help="Always, OnFailure, Never or ExitCode."),
    max_restarts: int = typer.Option(3, "--max-restarts", help="The job's backoffLimit."),
    cpu: str = typer.Option("1", "--cpu"),
    memory: str = typer.Option("2Gi", "--memory"),
    gpus: int = typer.Option(0, "--gpus"),
    env: Optional[List[str]] = typer.Option(None, "--env", help="KEY=VALUE, repeatable."),  # noqa: UP006,UP007
    backup_claim: Optional[str] = typer.Option(  # noqa: UP007
        None, "--backup-claim", help="An existing ReadWriteMany claim for backups (default: write one)."),
    backup_size: str = typer.Option("1Gi", "--backup-size"),
    storage_class: Optional[str] = typer.Option(  # noqa: UP007
        None, "--storage-class", help="Storage class of the claim written (one with ReadWriteMany volumes; "
                                      "default: the cluster's default class)."),
    mesh: bool = typer.Option(False, "--mesh", help="The workers are the processes of one DTensor mesh (sets "
                              "TENSORFLEET_MESH_ACROSS_PROCESSES=1 in each; workers only)."),
    out_path: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),  # noqa: UP007
) -> None:
    """Write a validated TFJob (kubeflow.org/v1) and the claim for its backups."""
    from tensorfleet import kube
    from tensorfleet.cluster import k8s

    argv = list(args or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if command is not None and argv:
        raise ValueError(f"Give the command either with --command or after '--', not both. Received: "
                         f"--command={command!r} and {argv!r}")
    if command is not None:
        argv = shlex.split(command)
    if not argv:
        raise ValueError("A TFJob needs the trainer's command: --command \"python train.py\" or '-- python train.py'.")
    docs = k8s.tfjob(name=name, image=image, command=argv, workers=workers, ps=ps, chief=chief, evaluator=evaluator,
                     namespace=namespace, restart_policy=restart_policy, max_restarts=max_restarts, cpu=cpu,
                     memory=memory, gpus=gpus, env=_parse_env(env or []), backup_claim=backup_claim,
                     backup_size=backup_size, storage_class=storage_class, mesh=mesh)
    if out_path is None:
        k8s.validate(docs)
        typer.echo(kube.dump_yaml(docs), nl=False)
    else:
        k8s.write(docs, out_path)
        typer.echo(f"wrote {out_path} ({', '.join(d['kind'] for d in docs)}), valid against the TFJob schema and "
                   f"Kubernetes {kube.KUBERNETES_VERSION}", err=True)


@app.command("validate")
def validate_command(manifest: Path = typer.Argument(..., help="A YAML manifest (a TFJob, serving, workers, ...).")
                     ) -> None:
    """Check a manifest against the core Kubernetes schemas, and a TFJob in it against the TFJob schema."""
    from tensorfleet import kube
    from tensorfleet.cluster import k8s

    with _about(manifest):
        docs = _read_manifest(manifest)
        if any(isinstance(doc, dict) and doc.get("kind") == "TFJob" for doc in docs):
            k8s.validate(docs)
        else:
            kube.validate(docs, expected="Kubernetes objects")
    typer.echo(f"{manifest}: valid ({', '.join(d['kind'] for d in docs)})")


@app.command("tf-config")
def tf_config_command(
    manifest: Path = typer.Argument(..., help="A YAML manifest with a TFJob."),
    role: str = typer.Option(..., "--role", help="chief, worker, ps or evaluator."),
    index: int = typer.Option(0, "--index"),
) -> None:
    """Print the TF_CONFIG the training operator gives one pod of the TFJob."""
    from tensorfleet.cluster import k8s

    with _about(manifest):
        config = k8s.pod_tf_config(_read_manifest(manifest), role, index)
    typer.echo(json.dumps(config))


@app.command("federated-workers")
def federated_workers_command(
    replicas: int = typer.Option(..., "--replicas", help="Number of worker pods."),
    image: str = typer.Option(..., "--image", help="Container image with tensorfleet installed."),
    runtime: str = typer.Option("tff", "--runtime", help="tff (TFF's C++ workers, backend='tff': the tff track) or "
                                "tensorflow (TensorFlow servers, backend='compiled' with workers: the current track)."),
    name: Optional[str] = typer.Option(  # noqa: UP007
        None, "--name", help="Deployment, Service and app label (default tff-workers, or tf-workers)."),
    namespace: str = typer.Option("default", "--namespace"),
    port: int = typer.Option(8000, "--port", help="The port every worker serves on."),
    max_concurrent: int = typer.Option(-1, "--max-concurrent", help="Parallel calls per computation (<= 0: no "
                                       "limit; tff only)."),
    cpu: str = typer.Option("1", "--cpu"),
    memory: str = typer.Option("2Gi", "--memory"),
    out_path: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),  # noqa: UP007
) -> None:
    """Write a validated Deployment and headless Service for N federated workers (TFF's or TensorFlow servers)."""
    from tensorfleet.federated.backends import k8s as fk8s

    docs = fk8s.federated_workers(replicas=replicas, image=image, name=name, namespace=namespace, port=port,
                                  max_concurrent=max_concurrent, cpu=cpu, memory=memory, runtime=runtime)
    _emit(docs, out_path, fk8s.write, f"Deployment and headless Service {docs[0]['metadata']['name']}, {replicas} "
                                    f"workers on port {port}")


@app.command("serving", context_settings={"allow_interspersed_args": False})
def serving_command(
    serve_args: Optional[List[str]] = typer.Argument(  # noqa: UP006,UP007
        None, help="More `tensorfleet serve` flags, after '--' (e.g. -- --enable-batching)."),
    name: str = typer.Option(..., "--name", help="Name of the Deployment, Service and autoscaler (a DNS label)."),
    image: str = typer.Option(..., "--image", help="Container image with tensorfleet (and the model, unless "
                              "--model-claim)."),
    replicas: Optional[int] = typer.Option(  # noqa: UP007
        None, "--replicas", help="Server pods (default 1; with --min/--max-replicas the autoscaler's)."),
    min_replicas: Optional[int] = typer.Option(  # noqa: UP007
        None, "--min-replicas", help="With --max-replicas: a HorizontalPodAutoscaler between them."),
    max_replicas: Optional[int] = typer.Option(None, "--max-replicas"),  # noqa: UP007
    target_cpu: int = typer.Option(80, "--target-cpu", help="The autoscaler's target: CPU use, percent of the "
                                   "request."),
    model_base_path: Optional[str] = typer.Option(  # noqa: UP007
        None, "--model-base-path", help="The model's base directory in the pod (default /models/NAME)."),
    model_name: Optional[str] = typer.Option(  # noqa: UP007
        None, "--model-name", help="The name clients ask for (default NAME)."),
    model_claim: Optional[str] = typer.Option(  # noqa: UP007
        None, "--model-claim", help="A claim holding the base directory, mounted read-only at it."),
    namespace: str = typer.Option("default", "--namespace"),
    port: int = typer.Option(8500, "--port", help="gRPC port."),
    rest_api_port: int = typer.Option(8501, "--rest-api-port", help="REST port (the probes use it)."),
    cpu: str = typer.Option("1", "--cpu"),
    memory: str = typer.Option("2Gi", "--memory"),
    out_path: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),  # noqa: UP007
) -> None:
    """Write a validated Deployment running `tensorfleet serve`, its Service (gRPC and REST) and, with
    --min-replicas/--max-replicas, a HorizontalPodAutoscaler (autoscaling/v2)."""
    from tensorfleet.serving import k8s as sk8s

    argv = list(serve_args or [])
    argv = argv[1:] if argv[:1] == ["--"] else argv
    docs = sk8s.serving_manifests(
        name=name, image=image, namespace=namespace,
        scaling=sk8s.PodScaling(replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                                target_cpu=target_cpu),
        model=sk8s.ServedModel(base_path=model_base_path, name=model_name, claim=model_claim),
        server=sk8s.ServerFlags(grpc_port=port, rest_port=rest_api_port, args=tuple(argv)),
        resources=sk8s.PodResources(cpu=cpu, memory=memory))
    _emit(docs, out_path, sk8s.write, ", ".join(d["kind"] for d in docs))


# Written with the tuning commands (tensorfleet.cli.tune); listed here with the other manifests.
app.command("tune")(k8s_tune_command)
