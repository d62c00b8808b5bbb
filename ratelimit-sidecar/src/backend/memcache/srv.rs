//! `MEMCACHE_SRV`: the node list from a DNS SRV record, as upstream builds it (one
//! `target:port` per record, sorted as strings, priority and weight ignored), looked up
//! again every `MEMCACHE_SRV_REFRESH` when that is set. A lookup that fails at start-up
//! stops it; one that fails later keeps the previous list, with a warning.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{Resolver, TokioResolver};

use super::NodeAddress;
use crate::backend::BackendError;

/// Looks SRV records up.
pub struct Discovery {
    resolver: TokioResolver,
    name: String,
}

impl Discovery {
    /// A lookup of `name` through `dns_server` (`ip:port`), or the system's resolver when
    /// it is empty.
    pub fn new(name: &str, dns_server: &str) -> Result<Discovery, BackendError> {
        let bad =
            |e: &dyn std::fmt::Display| BackendError::Settings(format!("MEMCACHE_SRV={name}: {e}"));
        let resolver = match dns_server {
            "" => Resolver::builder_tokio().map_err(|e| bad(&e))?.build(),
            server => {
                let address: SocketAddr = server.parse().map_err(|e| {
                    BackendError::Settings(format!("MEMCACHE_SRV_DNS_SERVER={server}: {e}"))
                })?;
                let mut udp = ConnectionConfig::udp();
                udp.port = address.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = address.port();
                let server = NameServerConfig::new(address.ip(), true, vec![udp, tcp]);
                let config = ResolverConfig::from_name_servers(vec![server]);
                Resolver::builder_with_config(config, TokioRuntimeProvider::default()).build()
            }
        }
        .map_err(|e| bad(&e))?;
        Ok(Discovery {
            resolver,
            name: name.to_owned(),
        })
    }

    /// The nodes the record names now, in upstream's order.
    pub async fn nodes(&self) -> Result<Vec<NodeAddress>, String> {
        let lookup = self
            .resolver
            .lookup(self.name.as_str(), RecordType::SRV)
            .await
            .map_err(|e| format!("SRV lookup of {}: {e}", self.name))?;
        let mut nodes = Vec::new();
        for record in lookup.answers() {
            let RData::SRV(srv) = &record.data else {
                continue;
            };
            let target = srv.target.to_string();
            let ip = self.address_of(&target).await?;
            nodes.push(NodeAddress {
                label: format!("{target}:{}", srv.port),
                connect: SocketAddr::new(ip, srv.port).to_string(),
            });
        }
        if nodes.is_empty() {
            return Err(format!("SRV lookup of {}: no records", self.name));
        }
        nodes.sort_by(|a, b| a.label.cmp(&b.label));
        Ok(nodes)
    }

    async fn address_of(&self, target: &str) -> Result<IpAddr, String> {
        let found = self
            .resolver
            .lookup_ip(target)
            .await
            .map_err(|e| format!("address of {target}: {e}"))?;
        found
            .iter()
            .next()
            .ok_or_else(|| format!("address of {target}: none"))
    }

    /// Looks the record up every `every` and publishes each new list in `list`.
    pub async fn refresh(self, every: Duration, list: Arc<ArcSwap<Vec<NodeAddress>>>) {
        loop {
            tokio::time::sleep(every).await;
            match self.nodes().await {
                Ok(nodes) if *list.load_full() != nodes => {
                    let labels: Vec<&str> = nodes.iter().map(|n| n.label.as_str()).collect();
                    tracing::warn!(nodes = ?labels, "memcached nodes changed (MEMCACHE_SRV)");
                    list.store(Arc::new(nodes));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "cannot refresh MEMCACHE_SRV; keeping the nodes");
                }
            }
        }
    }
}
