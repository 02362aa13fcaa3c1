//! ServiceAccount credentials: a token from the TokenRequest API and a kubeconfig that uses it,
//! so the controller and the agent run with exactly the RBAC the Helm chart grants them.

use std::path::Path;

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Pod, ServiceAccount},
};
use kube::{Api, api::PostParams};

use super::{
    kubeconfig::{KubeUser, kubeconfig, write_kubeconfig},
    plane::{ControlPlane, ControlPlaneError},
};

/// Mints a token for ServiceAccount `namespace/name` valid for `seconds` (the API server's
/// minimum is 600), with the API server's default audience.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    seconds: i64,
) -> Result<String, ControlPlaneError> {
    token_request(client, namespace, name, seconds, None).await
}

/// As [`service_account_token`], bound to the pod `bound` names in `namespace`, as the kubelet's
/// tokens for a pod are: the API server puts the pod's name and its node's into the token, and
/// into the user of every request made with it (`authentication.kubernetes.io/pod-name`,
/// `node-name`).
pub async fn pod_bound_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    seconds: i64,
    bound: &Pod,
) -> Result<String, ControlPlaneError> {
    let reference = BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: bound.metadata.name.clone(),
        uid: bound.metadata.uid.clone(),
    };
    token_request(client, namespace, name, seconds, Some(reference)).await
}

async fn token_request(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    seconds: i64,
    bound: Option<BoundObjectReference>,
) -> Result<String, ControlPlaneError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(seconds),
            bound_object_ref: bound,
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|source| ControlPlaneError::Api {
            what: format!("request a token for ServiceAccount {namespace}/{name}"),
            source,
        })?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ControlPlaneError::Invalid {
            what: "TokenRequest answer",
            value: format!("{namespace}/{name}"),
            why: "it carries no token",
        })
}

/// How long the ServiceAccount tokens the tests and benches hand out live: a day, because
/// `make bench-scale` runs for hours and its controllers use theirs throughout (with one hour, the
/// 100 000-pod run met 401 Unauthorized after its first hour).
pub const TOKEN_LIFETIME_SECS: i64 = 86_400;

impl ControlPlane {
    /// Writes to `path` a kubeconfig for ServiceAccount `namespace/name` with a fresh
    /// [`TOKEN_LIFETIME_SECS`] token, its context defaulting to `namespace`.
    pub async fn write_service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<(), ControlPlaneError> {
        let client = self.client()?;
        let token = service_account_token(&client, namespace, name, TOKEN_LIFETIME_SECS).await?;
        self.write_token_kubeconfig(namespace, name, token, path)
    }

    /// As [`Self::write_service_account_kubeconfig`], with a token bound to pod `pod` in
    /// `namespace` (which runs as that ServiceAccount): [`pod_bound_token`].
    pub async fn write_pod_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        pod: &str,
        path: &Path,
    ) -> Result<(), ControlPlaneError> {
        let client = self.client()?;
        let bound = Api::<Pod>::namespaced(client.clone(), namespace)
            .get(pod)
            .await
            .map_err(|source| ControlPlaneError::Api {
                what: format!("read pod {namespace}/{pod}"),
                source,
            })?;
        let token = pod_bound_token(&client, namespace, name, TOKEN_LIFETIME_SECS, &bound).await?;
        self.write_token_kubeconfig(namespace, name, token, path)
    }

    /// Writes to `path` a kubeconfig for ServiceAccount `namespace/name` with `token`.
    fn write_token_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        token: String,
        path: &Path,
    ) -> Result<(), ControlPlaneError> {
        let doc = kubeconfig(
            self.server(),
            self.ca_path(),
            &format!("system:serviceaccount:{namespace}:{name}"),
            &KubeUser::Token(token),
            Some(namespace),
        );
        write_kubeconfig(path, &doc)?;
        Ok(())
    }

    /// A client configuration that authenticates as ServiceAccount `namespace/name` with a
    /// fresh [`TOKEN_LIFETIME_SECS`] token (point it through a fault proxy with `FaultProxy::config_through`).
    pub async fn service_account_config(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Config, ControlPlaneError> {
        let admin = self.client()?;
        let token = service_account_token(&admin, namespace, name, TOKEN_LIFETIME_SECS).await?;
        let mut config = self.config();
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        config.default_namespace = namespace.to_owned();
        Ok(config)
    }

    /// A client that authenticates as ServiceAccount `namespace/name` with a fresh token.
    pub async fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Client, ControlPlaneError> {
        let config = self.service_account_config(namespace, name).await?;
        kube::Client::try_from(config).map_err(|source| ControlPlaneError::Api {
            what: format!("build a client for ServiceAccount {namespace}/{name}"),
            source,
        })
    }
}
