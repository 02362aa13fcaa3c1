//! Docker's remote IPAM protocol (moby `libnetwork/ipams/remote/api`): the JSON bodies the engine
//! sends and the ones it reads back. Field names are Go's (PascalCase); unknown fields are
//! ignored and `Options` may be `null` or absent, as the engine sends it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The option key carrying the container name (Docker Engine ≥ 29, moby PR #50586).
pub const ENDPOINT_NAME: &str = "com.docker.network.endpoint.name";
/// The option key carrying the endpoint's MAC address (sent when the driver requires it).
pub const MAC_ADDRESS: &str = "com.docker.network.endpoint.macaddress";
/// The option key saying what an address is for (`ipamapi.RequestAddressType`).
pub const REQUEST_ADDRESS_TYPE: &str = "RequestAddressType";
/// [`REQUEST_ADDRESS_TYPE`]'s value for a network's gateway (`netlabel.Gateway`).
pub const GATEWAY_TYPE: &str = "com.docker.network.gateway";
/// The per-network retention option (`--ipam-opt ipkeep.dev/retain-for=24h`).
pub const RETAIN_FOR_OPTION: &str = "ipkeep.dev/retain-for";

/// Options as the engine sends them: a string map, `null` or absent.
pub type Options = Option<BTreeMap<String, String>>;

/// `/Plugin.Activate`'s answer.
#[derive(Debug, Serialize)]
pub struct ActivateResponse {
    /// The protocols this plugin serves.
    #[serde(rename = "Implements")]
    pub implements: Vec<&'static str>,
}

/// `/IpamDriver.GetCapabilities`'s answer.
#[derive(Debug, Serialize)]
pub struct CapabilitiesResponse {
    /// Whether the engine must send a MAC address with every request (no: names are the key).
    #[serde(rename = "RequiresMACAddress")]
    pub requires_mac_address: bool,
    /// Whether the engine must replay requests on restart (no: the state is on disk).
    #[serde(rename = "RequiresRequestReplay")]
    pub requires_request_replay: bool,
}

/// `/IpamDriver.GetDefaultAddressSpaces`'s answer.
#[derive(Debug, Serialize)]
pub struct AddressSpacesResponse {
    /// The local address space's name.
    #[serde(rename = "LocalDefaultAddressSpace")]
    pub local: &'static str,
    /// The global address space's name.
    #[serde(rename = "GlobalDefaultAddressSpace")]
    pub global: &'static str,
}

/// `/IpamDriver.RequestPool`'s body.
#[derive(Debug, Default, Deserialize)]
pub struct RequestPoolRequest {
    /// The address space (one of ours).
    #[serde(rename = "AddressSpace", default)]
    pub address_space: String,
    /// The subnet asked for, empty for one of the driver's choosing.
    #[serde(rename = "Pool", default)]
    pub pool: String,
    /// The container range inside it (`--ip-range`), or empty.
    #[serde(rename = "SubPool", default)]
    pub sub_pool: String,
    /// The network's `--ipam-opt`s.
    #[serde(rename = "Options", default)]
    pub options: Options,
    /// Whether a pool of the driver's choosing must be IPv6.
    #[serde(rename = "V6", default)]
    pub v6: bool,
}

/// `/IpamDriver.RequestPool`'s answer.
#[derive(Debug, Serialize)]
pub struct RequestPoolResponse {
    /// The pool's identifier, sent back with every later request.
    #[serde(rename = "PoolID")]
    pub pool_id: String,
    /// The pool, in CIDR form.
    #[serde(rename = "Pool")]
    pub pool: String,
    /// Extra data for the engine (none).
    #[serde(rename = "Data")]
    pub data: BTreeMap<String, String>,
}

/// `/IpamDriver.ReleasePool`'s body.
#[derive(Debug, Deserialize)]
pub struct ReleasePoolRequest {
    /// The pool.
    #[serde(rename = "PoolID")]
    pub pool_id: String,
}

/// `/IpamDriver.RequestAddress`'s body.
#[derive(Debug, Deserialize)]
pub struct RequestAddressRequest {
    /// The pool.
    #[serde(rename = "PoolID")]
    pub pool_id: String,
    /// The address asked for, or empty for one of the driver's choosing.
    #[serde(rename = "Address", default)]
    pub address: String,
    /// What the address is for: the gateway type, the endpoint name.
    #[serde(rename = "Options", default)]
    pub options: Options,
}

/// `/IpamDriver.RequestAddress`'s answer.
#[derive(Debug, Serialize)]
pub struct RequestAddressResponse {
    /// The address with the pool's prefix length (`198.18.0.2/24`).
    #[serde(rename = "Address")]
    pub address: String,
    /// Extra data for the engine (none).
    #[serde(rename = "Data")]
    pub data: BTreeMap<String, String>,
}

/// `/IpamDriver.ReleaseAddress`'s body.
#[derive(Debug, Deserialize)]
pub struct ReleaseAddressRequest {
    /// The pool.
    #[serde(rename = "PoolID")]
    pub pool_id: String,
    /// The address.
    #[serde(rename = "Address")]
    pub address: String,
}

/// The answer to a failed call: the engine's plugin client reads `Err` from a non-200 answer.
#[derive(Debug, Serialize)]
pub struct ErrorResponse {
    /// The error, as the engine shows it to the user.
    #[serde(rename = "Err")]
    pub err: String,
}
