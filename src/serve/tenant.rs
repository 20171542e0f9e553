//! Who a request's cached prefixes belong to. Each `--api-key` is a tenant:
//! a prompt reuses KV entries (a sequence's, or the prompt cache's in RAM
//! and on disk) left by requests of its own tenant only, so `cached_tokens`
//! and the time to first token never tell one key's client what another
//! key's client sent. `--prompt-cache-scope user` also splits a key's
//! tenant by the request's `user` label (a label the client chooses: a
//! convenience between cooperating clients, not a boundary; a key is).
//! Without a key every client is one tenant.

use std::future::Future;

/// Tenants within a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CacheScope {
    /// One scope per API key (everyone, without a key).
    #[default]
    Key,
    /// One scope per API key and `user` label.
    User,
}

tokio::task_local! {
    /// The tenant of the request being handled, set by the key check around
    /// the handler (absent: no key is configured).
    static TENANT: u64;
}

/// The tenant that `key` names: a hash of it (never 0, the keyless tenant;
/// the key itself is not kept beside the cache).
pub(crate) fn tenant_of(key: &str) -> u64 {
    let h = blake3::hash(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(first).max(1)
}

/// Run `handler` as a request of `tenant`.
pub(crate) async fn serve_as<F: Future>(tenant: u64, handler: F) -> F::Output {
    TENANT.scope(tenant, handler).await
}

/// The scope of a job asked by `requester` within the current request's
/// tenant.
pub(crate) fn scope_of(scope: CacheScope, requester: &str) -> u64 {
    let tenant = TENANT.try_with(|t| *t).unwrap_or(0);
    match scope {
        CacheScope::Key => tenant,
        CacheScope::User => {
            let mut h = blake3::Hasher::new();
            h.update(&tenant.to_le_bytes());
            h.update(requester.as_bytes());
            let mut first = [0u8; 8];
            first.copy_from_slice(&h.finalize().as_bytes()[..8]);
            u64::from_le_bytes(first).max(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_and_users_get_their_own_scopes() {
        assert_ne!(tenant_of("alpha"), tenant_of("beta"));
        assert_ne!(tenant_of("alpha"), 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let key = |t, s, u: &'static str| rt.block_on(serve_as(t, async move { scope_of(s, u) }));
        assert_eq!(scope_of(CacheScope::Key, "ann"), 0, "no key: one tenant");
        assert_eq!(key(7, CacheScope::Key, "ann"), 7);
        assert_eq!(key(7, CacheScope::Key, "bob"), 7);
        let (ann, bob) = (
            key(7, CacheScope::User, "ann"),
            key(7, CacheScope::User, "bob"),
        );
        assert_ne!(ann, bob);
        assert_ne!(ann, key(8, CacheScope::User, "ann"));
    }
}
