//! Response representations a client can ask for through `Accept`: the object itself,
//! `PartialObjectMetadata`, or a `meta.k8s.io` `Table`.

use serde_json::{Value, json};

use super::table::IncludeObject;

/// What a GET/LIST/WATCH answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The stored object.
    Object,
    /// `meta.k8s.io/v1` `PartialObjectMetadata` (metadata only), as metadata watchers request.
    PartialMetadata,
    /// `meta.k8s.io/v1` `Table`, as kubectl requests.
    Table(IncludeObject),
}

/// Pick the representation from the Accept header (first supported entry wins) and `includeObject`.
pub fn negotiate(accept: &str, include_object: Option<&str>) -> Representation {
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let mut as_kind = None;
        let mut group = None;
        for param in parts {
            match param.split_once('=') {
                Some(("as", v)) => as_kind = Some(v),
                Some(("g", v)) => group = Some(v),
                _ => {}
            }
        }
        if !(media == "application/json" || media == "*/*" || media == "application/*") {
            // Protobuf and other encodings are not served; a later JSON entry may follow.
            continue;
        }
        match (as_kind, group) {
            (Some("Table"), Some("meta.k8s.io")) => {
                let include = match include_object {
                    Some("None") => IncludeObject::None,
                    Some("Object") => IncludeObject::Object,
                    _ => IncludeObject::Metadata,
                };
                return Representation::Table(include);
            }
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Representation::PartialMetadata;
            }
            (Some(_), _) => continue,
            (None, _) => return Representation::Object,
        }
    }
    Representation::Object
}

/// An object reduced to `PartialObjectMetadata`.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers() {
        let cases = [
            ("application/json", Representation::Object),
            ("", Representation::Object),
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
                Representation::Table(IncludeObject::Metadata),
            ),
            (
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                Representation::PartialMetadata,
            ),
            (
                "application/vnd.kubernetes.protobuf,application/json",
                Representation::Object,
            ),
            (
                "application/json;as=Unknown;g=x,application/json",
                Representation::Object,
            ),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept, None), want, "{accept}");
        }
        assert_eq!(
            negotiate(
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                Some("Object")
            ),
            Representation::Table(IncludeObject::Object)
        );
    }
}
