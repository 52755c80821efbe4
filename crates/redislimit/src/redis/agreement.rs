//! Configuration agreement: every replica of a scope admits with the same
//! settings, or the ones that differ are refused.
//!
//! Replicas that share a scope but not their settings would each apply
//! their own to the same Redis state: a `min_delay` of 2 s beside one of
//! 100 ms gives gaps that alternate between the two, and a cap of 1 beside
//! a cap of 3 lets 3 requests fly while every replica believes in 1. So the
//! first replica to acquire records, per scope, the settings that decide
//! admission; a replica whose settings differ gets
//! [`Error::ConfigMismatch`](crate::Error::ConfigMismatch) naming both, at
//! its first acquire or at [`RedisLimiter::check_config`](super::RedisLimiter::check_config).
//!
//! The record expires once no replica with its settings has acquired for
//! longer than the scope's longest window (the quota window, or `lease_ttl`
//! plus `min_delay`), plus a second: by then no state it shaped is left,
//! and a rollout that has drained its old replicas registers the new
//! settings. Each replica re-confirms the record on an acquire once half of
//! that has passed since it last did, so the cost is one extra round trip
//! per replica per half-life, not one per admission.
//!
//! What is compared: the mode and `cluster_concurrency`, `min_delay` (and
//! with it the spacing the mode implies), `quota` and `window`,
//! `max_bytes_per_sec`, and `lease_ttl`; with per-host rules, the keying and a digest of every
//! rule's pattern and those settings (`rules=N:<digest>`: the record stays
//! short however many rules there are). What shapes only one process is not: timeouts, hooks, the
//! in-process `max_concurrent`, jitter, retry intervals, the fallback. The
//! record is a line of `name=value` fields; a field added later is written
//! only when it differs from its default, so replicas that do not use a
//! new setting keep agreeing with those that do not know it. Settings read
//! from policies published to the scope end in ` policy=N`, their version:
//! a newer version takes the record over, an older one yields (see
//! `live.rs` and agree.lua).

use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::backend::{Backend, CallError};
use super::keys::RedisKeys;
use super::published::{PutBack, named_version};
use super::scripts::agree::Reply;
use super::settings::{Mode, QUOTA_BUCKETS, quota_buckets};
use crate::pacing::after;
use crate::{Error, Hooks, KeyBy, Op, Policies};

/// One limiter's part in its scope's agreement.
#[derive(Debug)]
pub(super) struct Agreement {
    key: String,
    /// When the record's settings were first recorded (see agree.lua).
    since_key: String,
    /// `prefix:scope`, as a mismatch names it.
    scope: String,
    /// This limiter's settings, as recorded.
    settings: String,
    /// How long the record outlives the last replica that confirmed it.
    ttl: Duration,
    /// When this limiter last extended the record (or put it back), and
    /// the record's `since`; `None` once it saw other settings there (or
    /// went idle longer than the record lives).
    confirmed: Mutex<Option<(Instant, u64)>>,
    /// Whether Redis failed to answer the heartbeat's check since the last
    /// confirmation (see `claim`).
    interrupted: std::sync::atomic::AtomicBool,
    /// When this limiter last acquired (µs since `epoch`), whether Redis
    /// answered or not: a limiter in use keeps its record (see `claim`).
    active_us: std::sync::atomic::AtomicU64,
    epoch: Instant,
    /// Held while the record is asked for: a crowd of acquires that find
    /// no fresh confirmation (a crawl's first acquire per host, all at
    /// once) sends one call, not one each.
    asking: tokio::sync::Mutex<()>,
    /// How the last call failed, and when it ended: a crowd that waited
    /// for it takes its answer rather than asking again one by one.
    failed: Mutex<Option<(Instant, Failed)>>,
    /// The published policies this limiter paces with (a version above
    /// 0), put back with the record: a replica started once the record is
    /// back finds the policies it names, instead of being refused until
    /// the next look of a live limiter in use puts them back.
    published: Option<PutBack>,
}

/// How a call for the record failed.
#[derive(Debug, Clone)]
enum Failed {
    /// The record holds other settings (theirs).
    Mismatch(String),
    /// Redis answered with an error, or with something unexpected.
    Answer(String),
}

impl Agreement {
    pub(super) fn new(
        prefix: &str,
        scope: &str,
        policies: &Policies,
        mode: impl Fn(usize) -> Mode,
        lease_ttl: Duration,
        policy_version: u64,
    ) -> Self {
        let describe = |i: usize| {
            let pacing = policies.at(i);
            let mode = match mode(i) {
                Mode::Serialized => "serialized".to_owned(),
                Mode::Lease(n) => format!("lease cluster_concurrency={n}"),
            };
            let window_us = pacing.window().as_micros() as u64;
            let quota = match (pacing.quota(), quota_buckets(pacing.quota(), window_us)) {
                (0, _) => "off".to_owned(),
                // Replicas that keep this quota another way (each
                // admission, or other buckets) would not count together.
                (q, 0) => format!("{q}/{:?}", pacing.window()),
                (q, _) => format!("{q}/{:?} in {QUOTA_BUCKETS} buckets", pacing.window()),
            };
            let mut described = format!(
                "mode={mode} min_delay={:?} quota={quota}",
                pacing.min_delay()
            );
            // Written only when set (see the module's documentation).
            if pacing.max_bytes_per_sec() > 0 {
                described.push_str(&format!(
                    " max_bytes_per_sec={}",
                    pacing.max_bytes_per_sec()
                ));
            }
            described
        };
        let mut settings = format!("{} lease_ttl={lease_ttl:?}", describe(0));
        // Written only when set, so replicas without rules keep agreeing
        // with those that do not know them.
        if policies.key_by() != KeyBy::Host {
            settings.push_str(&format!(" key_by={}", policies.key_by().as_str()));
        }
        if !policies.rules().is_empty() {
            let text = policies.canonical_rules(describe);
            let digest = Sha256::digest(text.as_bytes());
            let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
            settings.push_str(&format!(" rules={}:{hex}", policies.rules().len()));
        }
        // Last, and only for published policies: agree.lua reads it there
        // (a newer version takes the record over, an older one yields).
        if policy_version > 0 {
            settings.push_str(&format!(" policy={policy_version}"));
        }
        let longest = (0..policies.len())
            .map(|i| {
                let pacing = policies.at(i);
                pacing
                    .window()
                    .max(lease_ttl.saturating_add(pacing.min_delay()))
            })
            .max()
            .unwrap_or_default();
        Self {
            key: RedisKeys::config(prefix, scope),
            since_key: RedisKeys::config_since(prefix, scope),
            scope: format!("{prefix}:{scope}"),
            settings,
            ttl: longest.saturating_add(Duration::from_secs(1)),
            confirmed: Mutex::new(None),
            interrupted: std::sync::atomic::AtomicBool::new(false),
            active_us: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            asking: tokio::sync::Mutex::new(()),
            failed: Mutex::new(None),
            published: (policy_version > 0)
                .then(|| PutBack::new(prefix, scope, policy_version, policies.to_record())),
        }
    }

    /// This limiter's settings as the record describes them.
    pub(super) fn settings(&self) -> &str {
        &self.settings
    }

    /// Whether the record was confirmed recently enough to trust it.
    fn fresh(&self, now: Instant) -> bool {
        let confirmed = *self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        confirmed.is_some_and(|(at, _)| now < after(at, self.ttl / 2))
    }

    /// This limiter acquires now (whether Redis answers or not).
    /// After an idle spell at least as long as the record's life, what it
    /// agreed with before is no claim any more (the record may have lapsed
    /// as the agreement intends, and other settings taken the scope).
    pub(super) fn touch(&self) {
        let us = u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let before = self.active_us.load(std::sync::atomic::Ordering::Relaxed);
        if before != 0 && Duration::from_micros(us.saturating_sub(before)) >= self.ttl {
            // Before the new activity shows: no claim is read in between.
            self.unconfirm();
        }
        self.active_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `since` of the record this limiter agreed with, while its claim
    /// to the scope holds; 0 otherwise. It holds while the record this
    /// limiter last extended (or put back) should still be there, and,
    /// after Redis failed to answer its heartbeat's check (an outage),
    /// while it is in use (it acquired within the record's life, Redis
    /// answering or not): its record would still be there had Redis kept
    /// it. An idle limiter's claim ends with the record it extended, which
    /// then lapses as the agreement intends.
    fn claim(&self, now: Instant) -> u64 {
        let confirmed = *self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((at, since)) = confirmed else {
            return 0;
        };
        let active_us = self.active_us.load(std::sync::atomic::Ordering::Relaxed);
        let idle = now
            .saturating_duration_since(self.epoch)
            .saturating_sub(Duration::from_micros(active_us));
        let in_use = active_us != 0 && idle < self.ttl;
        let interrupted = self.interrupted.load(std::sync::atomic::Ordering::Relaxed);
        if now < after(at, self.ttl) || (interrupted && in_use) {
            since
        } else {
            0
        }
    }

    /// The record was extended (or put back) at `at`, and holds these
    /// settings since `since`.
    fn confirm(&self, at: Instant, since: u64) {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((at, since));
        self.interrupted
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.fail(None);
    }

    /// The record still holds these settings (it was not extended).
    fn still(&self, since: u64) {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, recorded)) = &mut *confirmed {
            *recorded = since;
        }
    }

    /// The record holds other settings: nothing admits on the last
    /// confirmation any more.
    fn unconfirm(&self) {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Whether an acquire's check of the record goes through to the node
    /// holding it: the limiter agreed with it before (a node away then
    /// skips nothing), or that node's circuit is closed.
    pub(super) fn answers(&self, backend: &Backend) -> bool {
        self.agreed_before() || backend.circuit(&self.key).closed()
    }

    /// Whether this limiter agreed with the record, and was not refused
    /// (or idle) since.
    fn agreed_before(&self) -> bool {
        self.confirmed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    fn fail(&self, failed: Option<Failed>) {
        *self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            failed.map(|f| (Instant::now(), f));
    }

    /// How a call that ended after `since` failed, if one did.
    fn failed_since(&self, since: Instant) -> Option<Failed> {
        self.failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| *at >= since)
            .map(|(_, f)| f.clone())
    }
}

impl Agreement {
    /// Makes sure the scope admits with this limiter's settings: from the
    /// last confirmation while it is fresh, from Redis otherwise (or when
    /// `force`d). A mismatch is reported to `hooks` where it is found.
    pub(super) async fn agree(
        &self,
        backend: &Backend,
        hooks: &dyn Hooks,
        force: bool,
    ) -> Result<(), Error> {
        self.ask(backend, hooks, force, true).await
    }

    /// [`agree`](Self::agree); `extend` extends the record's life (else a
    /// record of these settings is left as it is, and only a missing or
    /// displaced one put back).
    async fn ask(
        &self,
        backend: &Backend,
        hooks: &dyn Hooks,
        force: bool,
        extend: bool,
    ) -> Result<(), Error> {
        let started = Instant::now();
        if !force && self.fresh(started) {
            return Ok(());
        }
        // Once agreed, an acquire does not queue behind another's call (a
        // Cluster node holding the record may take a response timeout to
        // fail): what was agreed stands meanwhile.
        let _asking = if !force && self.agreed_before() {
            match self.asking.try_lock() {
                Ok(asking) => asking,
                Err(_) => return Ok(()),
            }
        } else {
            self.asking.lock().await
        };
        let asked = Instant::now();
        // Confirmed by the call this one waited for; or that call found
        // Redis not answering, and the circuit now holds off the rest; or
        // it failed otherwise, and this one fails alike.
        if !force && self.fresh(asked) {
            return Ok(());
        }
        if !force && !backend.circuit(&self.key).closed() {
            // A Cluster node holding the record may be away while the
            // host's own node answers: what was agreed stands meanwhile,
            // and the heartbeat, not an acquire, probes that node.
            if self.agreed_before() {
                return Ok(());
            }
            if backend.circuit(&self.key).waiting() {
                return Err(CallError::Skipped.into_error(Op::Acquire));
            }
        }
        match self.failed_since(started).filter(|_| !force) {
            Some(Failed::Mismatch(theirs)) => return Err(self.mismatch(theirs)),
            Some(Failed::Answer(why)) => return Err(Error::unavailable(Op::Acquire, why)),
            None => {}
        }
        let ttl_us = self.ttl.as_micros().min(u128::from(crate::MAX_MICROS)) as u64;
        let claim = self.claim(asked);
        let keys = [self.key.as_str(), self.since_key.as_str()];
        let reply = match backend
            .agree(keys, &self.settings, ttl_us, claim, extend)
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                let err = e.into_error(Op::Acquire);
                if err.is_unavailable() && !extend {
                    // The heartbeat's check: an outage, after which this
                    // limiter's claim lasts while it is in use.
                    self.interrupted
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                // Not answering opened the circuit, which holds off the
                // waiters; an error reply (READONLY, say) is remembered.
                if !backend.circuit(&self.key).waiting() {
                    self.fail(Some(Failed::Answer(crate::error::Causes(&err).to_string())));
                } else if !force && self.agreed_before() {
                    // The node holding the record is away (see above).
                    return Ok(());
                }
                return Err(err);
            }
        };
        match reply {
            Reply::Agreed { since, back } => {
                if extend || back {
                    self.confirm(asked, since);
                } else {
                    // Left as it was: the acquires keep extending it.
                    self.still(since);
                }
                if back {
                    tracing::warn!(scope = %self.scope, "the scope's configuration record was missing or held settings recorded after ours (Redis lost it: a restart, a failover, a flush); ours is back, and replicas started meanwhile with other settings are refused");
                    // The policies it names go back with it (only over
                    // none, or an older version put back), after the
                    // confirmation (a caller that gives up meanwhile
                    // loses only this): a replica started now follows
                    // them rather than being refused.
                    if let Some(published) = &self.published
                        && let Err(err) = published.run(backend).await
                    {
                        tracing::debug!(error = %crate::error::Causes(&err), "putting the published policies back failed; a live limiter's next look tries again");
                    }
                }
                Ok(())
            }
            Reply::Theirs(theirs) => {
                self.unconfirm();
                // Logged once while the record holds the same settings
                // (a live limiter waiting for a put-back asks every few
                // hundred milliseconds); the hooks hear of each.
                let again = matches!(
                    &*self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
                    Some((_, Failed::Mismatch(before))) if *before == theirs
                );
                self.fail(Some(Failed::Mismatch(theirs.clone())));
                // Newer published policies: a live limiter switches to them
                // (its callers see no error); a plain one is refused, and
                // its caller hears of it.
                let newer = named_version(&theirs) > named_version(&self.settings);
                let err = self.mismatch(theirs);
                match (again, newer) {
                    (true, _) => {}
                    (false, true) => {
                        tracing::info!(error = %crate::error::Causes(&err), "the scope paces with a newer version of the published policies than this limiter")
                    }
                    (false, false) => {
                        tracing::error!(error = %crate::error::Causes(&err), "configuration mismatch")
                    }
                }
                hooks.on_error(Op::Acquire, &err);
                Err(err)
            }
        }
    }

    /// Confirms the record again if this limiter agreed with it lately
    /// (from the heartbeat): a record Redis lost is put back within a
    /// heartbeat, before a replica with other settings can hold the scope
    /// for long. A limiter that never agreed, or was refused, leaves it to
    /// its acquires (which report what they find).
    pub(super) async fn keep(&self, backend: &Backend) {
        if self.claim(Instant::now()) == 0 {
            return;
        }
        if backend.circuit(&self.key).waiting() {
            self.interrupted
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let _ = self.ask(backend, &crate::hooks::NoHooks, true, false).await;
    }

    /// The error of a record that holds `theirs`, other settings than ours.
    fn mismatch(&self, theirs: String) -> Error {
        Error::ConfigMismatch {
            scope: self.scope.clone(),
            ours: self.settings.clone(),
            theirs,
        }
    }
}
