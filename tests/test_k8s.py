"""The Kubernetes manifests of examples/k8s/ validate against the published schemas
(scripts/validate_k8s.py: kubernetes-validate for Kubernetes' kinds and every
embedded pod/job template, kubeflow-trainer-api for Trainer v2 and JobSet,
kubeflow-training for PyTorchJob and MPIJob), and the validation can fail:
generated mutations of every manifest (an unknown field anywhere, a value of the
wrong type) are each reported with the path of the change."""
import copy
import glob
import os
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("kubernetes_validate")
pytest.importorskip("kubeflow_trainer_api")
pytest.importorskip("kubeflow.training")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import validate_k8s  # noqa: E402

FILES = sorted(glob.glob(os.path.join(ROOT, "examples", "k8s", "*.yaml")))
DOCS = [(os.path.basename(f), d) for f in FILES for d in yaml.safe_load_all(open(f)) if d]


def test_the_examples_cover_the_engines_the_issue_names():
    kinds = {d["kind"] for _, d in DOCS}
    assert {"TrainJob", "ClusterTrainingRuntime", "PyTorchJob", "JobSet", "MPIJob"} <= kinds, kinds


@pytest.mark.parametrize("name,doc", DOCS, ids=[f"{n}:{d['kind']}" for n, d in DOCS])
def test_manifest_validates(name, doc):
    assert validate_k8s.problems(doc) == []


def test_command_line_reports_and_exits_nonzero_on_a_bad_file(tmp_path):
    doc = copy.deepcopy(dict(DOCS)["pytorchjob.yaml"])
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "validate_k8s.py"), str(bad), *FILES],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pytorchReplicaSpecs.Worker.replicas: expected int" in r.stdout
    assert r.stdout.count(" valid") == len(DOCS)  # the good files still pass


def _objects(v, path=()):
    """Paths of every object (dict) a model describes, i.e. not a free-form map."""
    if isinstance(v, dict):
        yield path
        for k, x in v.items():
            if k not in validate_k8s._FREE:
                yield from _objects(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _objects(x, path + (i,))


def _at(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _scalars(v, path=()):
    """Paths of int and bool leaves (whose type the schemas fix)."""
    if isinstance(v, dict):
        for k, x in v.items():
            if k not in validate_k8s._FREE:
                yield from _scalars(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _scalars(x, path + (i,))
    elif isinstance(v, (bool, int)):
        yield path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_an_unknown_field_anywhere_is_reported_at_its_path(data):
    name, doc = data.draw(st.sampled_from(DOCS), label="manifest")
    doc = copy.deepcopy(doc)
    path = data.draw(st.sampled_from(list(_objects(doc))), label="object")
    key = data.draw(st.from_regex(r"\A[a-z][A-Za-z]{2,12}\Z"), label="key")
    target = _at(doc, path)
    if key in target:
        return
    target[key] = "x"
    found = validate_k8s.problems(doc)
    assert any(f".{key}: " in p or f"'{key}'" in p for p in found), (name, path, key, found)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_number_or_flag_of_the_wrong_type_is_reported(data):
    name, doc = data.draw(st.sampled_from([(n, d) for n, d in DOCS if list(_scalars(d))]), label="manifest")
    doc = copy.deepcopy(doc)
    path = data.draw(st.sampled_from(list(_scalars(doc))), label="leaf")
    parent = _at(doc, path[:-1])
    parent[path[-1]] = data.draw(st.sampled_from(["two", "yes", [1], {"a": 1}]), label="value")
    found = validate_k8s.problems(doc)
    assert found, (name, path)
    assert any(str(path[-1]) in p for p in found), (name, path, found)


def test_embedded_pod_templates_are_checked_against_kubernetes_schema():
    # A container without a name: the generated models do not enforce required
    # fields, Kubernetes' schema does; only the embedded-template check sees it.
    with_pods = [(n, d) for n, d in DOCS if list(_containers(d))]
    assert len(with_pods) >= 4, [n for n, _ in with_pods]
    for name, doc in with_pods:
        doc = copy.deepcopy(doc)
        containers = [c for p, c in _containers(doc)]
        del containers[0]["name"]
        found = validate_k8s.problems(doc)
        assert any("'name' is a required property" in p for p in found), (name, found)


def _containers(v, path=()):
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "containers" and isinstance(x, list):
                yield from ((path + (k, i), c) for i, c in enumerate(x))
            else:
                yield from _containers(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _containers(x, path + (i,))
