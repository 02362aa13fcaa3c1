#!/usr/bin/env bash
# Manual RBAC check: the chart's controller and agent ServiceAccounts running the WIP binaries
# against the real control plane with the audit log on; prints every request each SA made and any 403.
set -euo pipefail
T=/work/wt/packaging/target/debug
BIN=$(/tmp/pkgcombo/e2e/cluster/build.sh --print-bin-dir)
S=/tmp/pkgcp
export HELM_CACHE_HOME=/tmp/hh/c HELM_CONFIG_HOME=/tmp/hh/g HELM_DATA_HOME=/tmp/hh/d
$T/ipkeep-e2e cluster down --state-dir $S >/dev/null 2>&1 || true
$T/ipkeep-e2e cluster up --state-dir $S --audit-log >/dev/null
eval "$($T/ipkeep-e2e cluster env --state-dir $S)"
K="$BIN/kubectl"
"$BIN/helm" install rbac ./charts/ipkeep -n ipkeep-system --create-namespace >/dev/null
SERVER=$($K config view --minify -o jsonpath='{.clusters[0].cluster.server}')
$K config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > $S/sa-ca.crt
kc() { # kubeconfig for SA $1
  local kc=$S/$1.kubeconfig token; token=$($K create token $1 -n ipkeep-system); rm -f $kc
  KUBECONFIG=$kc $K config set-cluster c --server=$SERVER --certificate-authority=$S/sa-ca.crt >/dev/null
  KUBECONFIG=$kc $K config set-credentials sa --token=$token >/dev/null
  KUBECONFIG=$kc $K config set-context x --cluster=c --user=sa --namespace=ipkeep-system >/dev/null
  KUBECONFIG=$kc $K config use-context x >/dev/null
  echo $kc
}
CKC=$(kc rbac-ipkeep-controller); AKC=$(kc rbac-ipkeep-agent)
$K create namespace work >/dev/null
mkdir -p $S/data/cbr0
KUBECONFIG=$AKC $T/ipkeep-operator agent --node-name node-a --data-dir $S/data --network cbr0 --probe-addr 127.0.0.1:0 >$S/agent.log 2>&1 &
APID=$!
KUBECONFIG=$CKC $T/ipkeep-operator controller --metrics-addr 127.0.0.1:0 --lease-name rbac-ipkeep-controller --lease-namespace ipkeep-system --identity check >$S/controller.log 2>&1 &
CPID=$!
printf 'apiVersion: ipkeep.dev/v1alpha1\nkind: IPReservation\nmetadata: {name: web-0, namespace: work}\nspec: {ips: ["10.244.1.17"], nodeName: node-a, retainFor: 5s}\n' | $K apply -f - >/dev/null
for i in $(seq 1 40); do [ -e $S/data/cbr0/reserved/work/web-0 ] && break; sleep 0.25; done
echo "file written by the agent: $(ls $S/data/cbr0/reserved/work/ 2>&1)"
for i in $(seq 1 80); do $K get ipreservations -n work web-0 >/dev/null 2>&1 || break; sleep 0.25; done
for i in $(seq 1 40); do [ -e $S/data/cbr0/reserved/work/web-0 ] || break; sleep 0.25; done
echo "after expiry: reservations [$($K get ipreservations -n work -o name)] files [$(ls $S/data/cbr0/reserved/work/ 2>&1)]"
kill $CPID $APID; wait $CPID || true; wait $APID || true
echo "--- agent log"; tail -4 $S/agent.log
python3 - "$S" <<'PY'
import json,sys,collections
s=sys.argv[1]
for sa in ("rbac-ipkeep-controller","rbac-ipkeep-agent"):
    user=f"system:serviceaccount:ipkeep-system:{sa}"
    seen=collections.Counter(); denied=[]
    for line in open(f"{s}/audit.log"):
        e=json.loads(line)
        if e.get("user",{}).get("username")!=user or e.get("stage")!="ResponseComplete": continue
        o=e.get("objectRef",{})
        key=(e["verb"],o.get("apiGroup",""),o.get("resource",""),o.get("subresource",""))
        seen[key]+=1
        if e.get("responseStatus",{}).get("code")==403: denied.append(key)
    print("==", sa); [print(" ",v,k) for k,v in sorted(seen.items())]
    print("  DENIED:",sorted(set(denied)))
PY
$T/ipkeep-e2e cluster down --state-dir $S
