//! e2b's network options: the `network` object and `allow_internet_access` of a create, the
//! `PUT /sandboxes/{id}/network` update, and how a sandbox's policy is reported. Egress lists
//! of IPv4 addresses and CIDRs are enforced in the sandbox's network namespace, domain names and
//! per-host header rules by the node's egress proxy; what is not built (a bring-your-own proxy,
//! HTTPS ports) is refused by name.

use actix_web::{HttpResponse, web};

use super::auth::Tenant;
use super::body::Body;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::{E2b, wire};
use crate::model::SandboxRecord;
use crate::model::network::NetworkPolicy;

type Data = web::Data<E2b>;

/// Most DNS servers e2b takes.
const MAX_DNS_SERVERS: usize = 10;

/// The policy a create or an update asks for. `allow_internet_access` comes from the
/// create's top level or the update's body.
pub fn policy(
    cfg: Option<&wire::NetworkConfig>,
    allow_internet_access: Option<bool>,
) -> ApiResult<NetworkPolicy> {
    let Some(cfg) = cfg else {
        return Ok(NetworkPolicy {
            allow_internet_access,
            ..Default::default()
        });
    };
    let refuse = |what: &str, why: &str| {
        Err(ApiError::bad_request(format!(
            "network.{what} is not supported by this gateway: {why}"
        )))
    };
    if cfg.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse(
            "egressProxy",
            "outbound traffic leaves through the sandbox's node",
        );
    }
    if cfg.https_ports.as_ref().is_some_and(|p| !p.is_empty()) {
        return refuse(
            "httpsPorts",
            "the gateway reaches sandbox ports over plain HTTP",
        );
    }
    if let Some(dns) = &cfg.dns_servers {
        if dns.len() > MAX_DNS_SERVERS {
            return Err(ApiError::bad_request(format!(
                "network.dnsServers has {} entries; at most {MAX_DNS_SERVERS} are allowed",
                dns.len()
            )));
        }
        if let Some(bad) = dns
            .iter()
            .find(|d| d.parse::<std::net::Ipv4Addr>().is_err())
        {
            return Err(ApiError::bad_request(format!(
                "network.dnsServers: {bad:?} is not an IPv4 address"
            )));
        }
    }
    let rules = match cfg.rules.as_ref().filter(|v| !v.is_null()) {
        None => Default::default(),
        Some(v) => crate::model::transforms::normalized(
            serde_json::from_value(v.clone()).map_err(|e| {
                ApiError::bad_request(format!(
                    "network.rules must map hosts to lists of {{\"transform\": {{\"headers\": {{name: value}}}}}}: {e}"
                ))
            })?,
        ),
    };
    let policy = NetworkPolicy {
        allow_out: cfg.allow_out.clone().unwrap_or_default(),
        deny_out: cfg.deny_out.clone().unwrap_or_default(),
        allow_internet_access: allow_internet_access.or(cfg.allow_internet_access),
        allow_public_traffic: cfg.allow_public_traffic.unwrap_or(true),
        mask_request_host: cfg.mask_request_host.clone().filter(|m| !m.is_empty()),
        dns_servers: cfg.dns_servers.clone(),
        rules,
    };
    policy.validate().map_err(ApiError::from)?;
    Ok(policy)
}

/// Whether the sandbox reaches the internet at all, as `allowInternetAccess` reports it.
pub fn internet_access(record: &SandboxRecord) -> bool {
    record.key.net == "egress"
        && record.network.allow_internet_access != Some(false)
        && !record.network.denies_everything()
}

/// The `network` object of `GET /sandboxes/{id}`; omitted when nothing was asked for.
pub fn info(record: &SandboxRecord) -> Option<wire::NetworkInfo> {
    let n = &record.network;
    if n.allow_out.is_empty()
        && n.deny_out.is_empty()
        && n.allow_public_traffic
        && n.mask_request_host.is_none()
        && n.rules.is_empty()
    {
        return None;
    }
    Some(wire::NetworkInfo {
        allow_out: n.allow_out.clone(),
        deny_out: n.deny_out.clone(),
        allow_public_traffic: n.allow_public_traffic,
        mask_request_host: n.mask_request_host.clone(),
        dns_servers: n.dns_servers.clone(),
        rules: n.rules.clone(),
    })
}

#[utoipa::path(put, path = "/sandboxes/{sandboxID}/network", tag = "sandboxes",
    params(("sandboxID" = String, Path)), request_body = wire::NetworkConfig,
    responses((status = 204, description = "the egress rules were replaced; open connections' next packets follow them"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)),
    security(("ApiKeyAuth" = [])))]
pub async fn update(
    e2b: Data,
    tenant: Tenant,
    id: web::Path<String>,
    body: Body<wire::NetworkConfig>,
) -> ApiResult<HttpResponse> {
    if body.0.allow_public_traffic.is_some() || body.0.mask_request_host.is_some() {
        return Err(ApiError::bad_request(
            "allowPublicTraffic and maskRequestHost are set when the sandbox is created; an update replaces only its egress rules",
        ));
    }
    let policy = policy(Some(&body.0), None)?;
    e2b.dispatcher
        .update_network(tenant.scope(), &id, &policy)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> wire::NetworkConfig {
        serde_json::from_value(v).expect("a network config")
    }

    #[test]
    fn lists_and_flags_become_the_policy() {
        let p = policy(
            Some(&cfg(serde_json::json!({
                "allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false,
                "dnsServers": ["8.8.8.8"]
            }))),
            None,
        )
        .unwrap();
        assert_eq!(p.allow_out, vec!["1.1.1.1"]);
        assert_eq!(p.deny_out, vec!["0.0.0.0/0"]);
        assert!(!p.allow_public_traffic);
        let p = policy(None, Some(false)).unwrap();
        assert!(p.denies_everything());
        let p = policy(
            Some(&cfg(serde_json::json!({"allow_internet_access": false}))),
            None,
        )
        .unwrap();
        assert_eq!(p.allow_internet_access, Some(false));
        assert_eq!(
            policy(Some(&cfg(serde_json::json!({}))), None).unwrap(),
            NetworkPolicy::default()
        );
    }

    #[test]
    fn what_needs_an_egress_proxy_is_refused_by_name() {
        for (body, named) in [
            (
                serde_json::json!({"allowOut": ["example.com"]}),
                "ALL_TRAFFIC",
            ),
            (
                serde_json::json!({"egressProxy": {"address": "p:1080"}}),
                "egressProxy",
            ),
            (serde_json::json!({"rules": {"*": [{}]}}), "network.rules"),
            (
                serde_json::json!({"rules": {"a.com": "x"}}),
                "network.rules",
            ),
            (
                serde_json::json!({"rules": {"a.com": [{"transform": {"headers": {"X": "${e2b.identity.tokens.t}"}}}]}}),
                "identity",
            ),
            (
                serde_json::json!({"maskRequestHost": "x.example.com:port"}),
                "maskRequestHost",
            ),
            (serde_json::json!({"httpsPorts": [3000]}), "httpsPorts"),
            (
                serde_json::json!({"dnsServers": ["dns.google"]}),
                "dnsServers",
            ),
            (serde_json::json!({"denyOut": ["::/0"]}), "IPv6"),
        ] {
            let err = policy(Some(&cfg(body.clone())), None).unwrap_err();
            assert!(err.message.contains(named), "{body}: {}", err.message);
            assert_eq!(err.status, actix_web::http::StatusCode::BAD_REQUEST);
        }
        assert!(
            policy(
                Some(&cfg(serde_json::json!({"egressProxy": null, "rules": {}}))),
                None
            )
            .is_ok(),
            "empty values ask for nothing"
        );
    }

    #[test]
    fn rules_are_kept_with_their_hosts_lowercased() {
        let p = policy(
            Some(&cfg(serde_json::json!({"rules": {
                "API.Example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.key}"}}}]
            }}))),
            None,
        )
        .unwrap();
        let headers = &p.rules["api.example.com"][0]
            .transform
            .as_ref()
            .unwrap()
            .headers;
        assert_eq!(headers["Authorization"], "Bearer ${e2b.secrets.key}");
        let egress = p.egress().unwrap().expect("headers to set need the proxy");
        assert!(egress.needs_proxy() && egress.deny.is_empty());
    }
}
