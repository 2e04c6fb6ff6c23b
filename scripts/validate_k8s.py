"""Validate Kubernetes manifests (examples/k8s/) against the published schemas.

    python3 scripts/validate_k8s.py examples/k8s/*.yaml      # exit 1 and one line per problem

Which schema checks what:
  * Kubernetes' own kinds, and every pod and job template embedded in a custom
    resource: kubernetes-validate (the Kubernetes API's JSON schemas, bundled per
    release) in strict mode, so unknown fields are errors.
  * Kubeflow Trainer v2 (TrainJob, ClusterTrainingRuntime, TrainingRuntime) and
    JobSet: the models of kubeflow-trainer-api, generated from Trainer's OpenAPI
    spec (pydantic, strict types).
  * Kubeflow Training Operator v1 (PyTorchJob, MPIJob): the models of
    kubeflow-training, generated from the operator's OpenAPI spec (declared
    types; nested Kubernetes types from the kubernetes client's models).
Both generated model styles drop unknown fields silently, and a misspelt field
in a manifest is the commonest mistake (the API server drops it too, so the job
runs without it), so this script walks every object against the declared
fields and reports what the model does not know, with its path.

Usable as a library: problems(doc) returns the list of problems of one parsed
document ([] when it validates); tests/test_k8s.py uses it.
"""
from __future__ import annotations

import datetime
import sys
import typing

import functools

import kubernetes_validate
import kubernetes_validate.utils
import yaml
from pydantic import BaseModel, ValidationError

K8S_VERSION = "1.33"  # the oldest Kubernetes the examples target (hugepages, JobSet, Trainer v2)

# kubernetes-validate reads its JSON schemas from disk on every call (megabytes);
# they never change while we run.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)

# Paths whose values are free-form maps (keys chosen by the user).
_FREE = {"labels", "annotations", "requests", "limits", "nodeSelector", "data", "stringData"}


def _trainer_models():
    from kubeflow_trainer_api import models as m

    return {("trainer.kubeflow.org/v1alpha1", "TrainJob"): m.TrainerV1alpha1TrainJob,
            ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): m.TrainerV1alpha1ClusterTrainingRuntime,
            ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): m.TrainerV1alpha1TrainingRuntime,
            ("jobset.x-k8s.io/v1alpha2", "JobSet"): m.JobsetV1alpha2JobSet}


_OAPI = {("kubeflow.org/v1", "PyTorchJob"): "KubeflowOrgV1PyTorchJob",
         ("kubeflow.org/v1", "MPIJob"): "KubeflowOrgV1MPIJob"}


# ---------------------------------------------------------------------------
# pydantic models (kubeflow-trainer-api)

def _is_model(t) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _walk_pydantic(t, v, path, out):
    origin = typing.get_origin(t)
    if t is typing.Any or v is None:
        return
    if origin is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return _walk_pydantic(args[0], v, path, out)
        return  # a true union: the package's own validation decides
    if origin is typing.Annotated:
        return _walk_pydantic(typing.get_args(t)[0], v, path, out)
    if origin in (list, typing.List):
        if not isinstance(v, list):
            return out.append(f"{path}: expected a list, got {type(v).__name__}")
        (item,) = typing.get_args(t)
        for i, x in enumerate(v):
            _walk_pydantic(item, x, f"{path}[{i}]", out)
        return
    if origin in (dict, typing.Dict):
        if not isinstance(v, dict):
            return out.append(f"{path}: expected a map, got {type(v).__name__}")
        _, val = typing.get_args(t)
        for k, x in v.items():
            _walk_pydantic(val, x, f"{path}.{k}", out)
        return
    if _is_model(t) and "one_of_schemas" in t.model_fields:  # Quantity, IntOrString: a scalar
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            out.append(f"{path}: expected one of {sorted(t.model_fields['one_of_schemas'].default)}, "
                       f"got {type(v).__name__}")
        return
    if _is_model(t):
        if not isinstance(v, dict):
            return out.append(f"{path}: expected an object ({t.__name__}), got {type(v).__name__}")
        fields = {(f.alias or name): f.annotation for name, f in t.model_fields.items()}
        for k, x in v.items():
            if k not in fields:
                out.append(f"{path}.{k}: unknown field (known: {', '.join(sorted(fields))})")
            elif k not in _FREE:
                _walk_pydantic(fields[k], x, f"{path}.{k}", out)


# ---------------------------------------------------------------------------
# openapi-generator v1 models (kubeflow-training, kubernetes client)

def _oapi_class(name):
    from kubeflow.training import models as kf
    from kubernetes.client import models as k8s

    return getattr(kf, name, None) or getattr(k8s, name, None)


_PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _walk_oapi(tname, v, path, out):
    if v is None or tname == "object":
        return
    if tname.startswith("list["):
        if not isinstance(v, list):
            return out.append(f"{path}: expected a list, got {type(v).__name__}")
        for i, x in enumerate(v):
            _walk_oapi(tname[5:-1], x, f"{path}[{i}]", out)
        return
    if tname.startswith("dict("):
        if not isinstance(v, dict):
            return out.append(f"{path}: expected a map, got {type(v).__name__}")
        val = tname[5:-1].split(",", 1)[1].strip()
        for k, x in v.items():
            _walk_oapi(val, x, f"{path}.{k}", out)
        return
    if tname in _PRIMITIVE:
        ok = isinstance(v, _PRIMITIVE[tname]) and not (tname != "bool" and isinstance(v, bool))
        if not ok:
            out.append(f"{path}: expected {tname}, got {type(v).__name__} {v!r}")
        return
    if tname in ("datetime", "date"):
        if not isinstance(v, (str, datetime.date)):
            out.append(f"{path}: expected a {tname}, got {type(v).__name__}")
        return
    cls = _oapi_class(tname)
    if cls is None:
        return out.append(f"{path}: no model named {tname} (validator out of date?)")
    if not isinstance(v, dict):
        return out.append(f"{path}: expected an object ({tname}), got {type(v).__name__}")
    by_key = {cls.attribute_map[a]: t for a, t in cls.openapi_types.items()}
    for k, x in v.items():
        if k not in by_key:
            out.append(f"{path}.{k}: unknown field (known: {', '.join(sorted(by_key))})")
        elif k not in _FREE:
            _walk_oapi(by_key[k], x, f"{path}.{k}", out)


# ---------------------------------------------------------------------------
# Kubernetes' own schemas, also for templates embedded in custom resources

def _k8s(doc, path, out):
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        out.append(f"{path}{'.' + where if where else ''}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError as e:
        out.append(f"{path}: {e.message}")


def _templates(v, path):
    """(path, wrapped document) for every pod template and job template inside v."""
    if isinstance(v, dict):
        spec = v.get("spec")
        if isinstance(spec, dict) and path.endswith("template"):
            if "containers" in spec:
                yield path, {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": v}
                return
            if "template" in spec:
                yield path, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "t"}, "spec": spec}
                return
        for k, x in v.items():
            yield from _templates(x, f"{path}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _templates(x, f"{path}[{i}]")


def problems(doc) -> list[str]:
    """Problems of one parsed manifest document ([] when it validates)."""
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        return ["not a Kubernetes object (apiVersion and kind are required)"]
    key = (doc["apiVersion"], doc["kind"])
    name = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
    out: list[str] = []
    trainer = _trainer_models()
    if key in trainer:
        cls = trainer[key]
        _walk_pydantic(cls, doc, name, out)
        try:
            cls.from_dict(doc)
        except ValidationError as e:
            out += [f"{name}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
    elif key in _OAPI:
        _walk_oapi(_OAPI[key], doc, name, out)
    else:
        _k8s(doc, name, out)
        return out
    for path, wrapped in _templates(doc.get("spec"), f"{name}.spec"):
        _k8s(wrapped, path, out)
    return out


def main(argv=None) -> int:
    files = sys.argv[1:] if argv is None else argv
    if not files:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    bad = 0
    for f in files:
        with open(f) as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
        for d in docs:
            ps = problems(d)
            bad += bool(ps)
            for p in ps:
                print(f"{f}: {p}")
            if not ps:
                print(f"{f}: {d['kind']}/{d['metadata']['name']} valid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
