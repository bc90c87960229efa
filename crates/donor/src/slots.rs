//! Authenticated connection slots: bounds per client id and per tenant, and each tenant's fair
//! share of the pool, so that one tenant's connections cannot lock another tenant out.
//!
//! # Design
//! A connection takes a slot when its AUTH succeeds and gives it back when it closes. The pool
//! holds `pool` slots (the donor's connection limit less the slots kept for handshakes). Half
//! of the pool is divided evenly among the `n` tenants: each is guaranteed
//! `min(pool / (2 n), its bound)` slots, its *fair share*. Beyond its share a tenant may borrow
//! free slots, first come first served, but only those no other tenant's unused share needs: a
//! slot is granted only if, after it, the sum over tenants of `max(connections, fair share)` is
//! at most `pool`. So a tenant below its share is always admitted (up to the per-client bound),
//! however many connections the others hold, and a tenant alone may use the whole pool.
//!
//! Refusals are [`Status::DonorFull`] with a message naming the bound ("tenant T has N
//! connections, its bound …"): to the client it means what a full donor means (this donor serves
//! no more connections for it now), and the runtime already handles that.
//!
//! # Limitations
//! All holders of one token are one tenant: they share its slots. Give each party its own
//! tenant (`--tenants`) to keep them apart.
use std::collections::HashMap;

use farmem_proto::Status;
use parking_lot::Mutex;

use crate::store::Refusal;

/// Default bound on the connections of one client id (`--max-conns-per-client`): the whole
/// pool, i.e. none of its own. A runtime opens two per donor, but each forked child of a process
/// tree attaches as its parent's client to read the pages the parent lent it, so a prefork
/// server with hundreds of workers is one client with hundreds of connections (64 refused the
/// 65th worker its pages). Tenants are kept apart by the fair share, not by this bound.
pub const MAX_CONNS_PER_CLIENT: usize = crate::limits::MAX_CONNECTIONS;

/// The bounds, fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct SlotBounds {
    /// Authenticated slots in all.
    pub(crate) pool: usize,
    /// Most connections of one client id.
    pub(crate) per_client: usize,
    /// Each tenant's name and bound (`None`: the pool).
    pub(crate) tenants: Vec<(String, Option<usize>)>,
}

struct State {
    per_tenant: Vec<usize>,
    per_client: HashMap<u64, usize>,
}

/// The authenticated slots of a donor.
pub(crate) struct Slots {
    bounds: SlotBounds,
    /// Each tenant's guaranteed slots.
    share: Vec<usize>,
    state: Mutex<State>,
}

impl Slots {
    pub(crate) fn new(bounds: SlotBounds) -> Slots {
        let n = bounds.tenants.len().max(1);
        let fair = bounds.pool / (2 * n);
        let share = bounds
            .tenants
            .iter()
            .map(|(_, b)| b.map_or(fair, |b| b.min(fair)))
            .collect();
        let state = State {
            per_tenant: vec![0; bounds.tenants.len()],
            per_client: HashMap::new(),
        };
        Slots {
            bounds,
            share,
            state: Mutex::new(state),
        }
    }

    /// A connection of `tenant` authenticated as `client` takes a slot, or is refused with the
    /// bound it hit.
    pub(crate) fn take(&self, tenant: usize, client: u64) -> Result<(), Refusal> {
        let mut s = self.state.lock();
        let (name, bound) = &self.bounds.tenants[tenant];
        let of_client = s.per_client.get(&client).copied().unwrap_or(0);
        if of_client >= self.bounds.per_client {
            return Err(refusal(format!(
                "client {client} has {of_client} connections, its bound (--max-conns-per-client {}); close some of them",
                self.bounds.per_client
            )));
        }
        let of_tenant = s.per_tenant[tenant];
        if let Some(b) = *bound {
            if of_tenant >= b {
                return Err(refusal(format!(
                    "tenant {name} has {of_tenant} connections, its bound ({b}, --max-conns-per-tenant or the tenant's max_connections); close some of them"
                )));
            }
        }
        let held: usize = s
            .per_tenant
            .iter()
            .zip(&self.share)
            .enumerate()
            .map(|(t, (&c, &g))| if t == tenant { c + 1 } else { c }.max(g))
            .sum();
        if held > self.bounds.pool {
            let others = self.bounds.pool.saturating_sub(of_tenant);
            return Err(refusal(format!(
                "tenant {name} has {of_tenant} connections, its bound while other tenants may need their fair share ({} of the {} slots each); the other {others} slots are kept for them: close some connections or try again later",
                self.share[tenant], self.bounds.pool
            )));
        }
        s.per_tenant[tenant] += 1;
        *s.per_client.entry(client).or_insert(0) += 1;
        Ok(())
    }

    /// A connection that took a slot for `tenant` and `client` closed.
    pub(crate) fn give_back(&self, tenant: usize, client: u64) {
        let mut s = self.state.lock();
        s.per_tenant[tenant] = s.per_tenant[tenant].saturating_sub(1);
        if let Some(c) = s.per_client.get_mut(&client) {
            *c -= 1;
            if *c == 0 {
                s.per_client.remove(&client);
            }
        }
    }
}

fn refusal(message: String) -> Refusal {
    Refusal {
        status: Status::DonorFull,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(pool: usize, per_client: usize, tenants: &[Option<usize>]) -> Slots {
        Slots::new(SlotBounds {
            pool,
            per_client,
            tenants: tenants
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("t{i}"), *b))
                .collect(),
        })
    }

    #[test]
    fn a_greedy_tenant_leaves_every_other_tenant_its_fair_share() {
        let s = slots(12, 100, &[None, None, None]);
        let mut greedy = 0;
        for c in 0..100u64 {
            if s.take(0, c).is_ok() {
                greedy += 1;
            }
        }
        assert_eq!(greedy, 8, "12 slots, 3 tenants: the others keep 2 each");
        for c in 0..2 {
            s.take(1, 1000 + c).unwrap();
            s.take(2, 2000 + c).unwrap();
        }
        let e = s.take(1, 1100).unwrap_err();
        assert_eq!(e.status, Status::DonorFull);
        assert!(e.message.contains("tenant t1 has 2 connections"), "{e:?}");
        // Slots given back are free again for whoever comes first.
        s.give_back(0, 0);
        s.take(1, 1100).unwrap();
        // Alone, a tenant may use the whole pool.
        let s = slots(12, 100, &[None]);
        for c in 0..12u64 {
            s.take(0, c).unwrap();
        }
        assert!(s.take(0, 99).is_err());
    }

    #[test]
    fn client_and_tenant_bounds_are_named_in_the_refusal() {
        let s = slots(100, 2, &[Some(3), None]);
        s.take(0, 1).unwrap();
        s.take(0, 1).unwrap();
        let e = s.take(0, 1).unwrap_err();
        assert!(
            e.message.contains("client 1 has 2 connections")
                && e.message.contains("--max-conns-per-client 2"),
            "{e:?}"
        );
        s.take(0, 2).unwrap();
        let e = s.take(0, 3).unwrap_err();
        assert!(
            e.message
                .contains("tenant t0 has 3 connections, its bound (3"),
            "{e:?}"
        );
        s.give_back(0, 1);
        s.take(0, 3).unwrap();
    }
}
