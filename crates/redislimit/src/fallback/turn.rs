//! A fallback acquire's admission at this replica's share of the pacing,
//! in its turns, while the primary is away (and in the grace after).

use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Acquire;
use super::plan::{stated_share, turn_lead, turn_left, turn_window, until_turn, wall_clock};
use crate::limiter::heaviest;
use crate::pacing::after;
use crate::{Error, HostKey, Limiter, Permit, RequestPacing};

impl<P: Limiter + 'static> Acquire<'_, P> {
    /// Admits `host` at this replica's share of the pacing, `n` replicas
    /// dividing it: no send before the outage began + `min_delay` (another
    /// replica's last admission through the primary may be that recent),
    /// nor before this replica's own last send + `n` x `min_delay`, and then
    /// `n` x `min_delay` apart, at most `quota / n` per window and
    /// `max_concurrent / n` in flight (and its part of a cap the host
    /// stated, see `stated_share`).
    ///
    /// The replicas also take turns: time is cut into `min_delay` slots
    /// (by the wall clock, which replicas share up to their clock offset)
    /// and replica `index` sends only at the start of slots `index`,
    /// `index + n`, ..., so their sends interleave instead of bunching, and
    /// any interval holds no more sends than the shared pace allows.
    ///
    /// `None`: the host stated a cap on requests in flight of which this
    /// replica's part is none (see `no_part`) after the caller checked,
    /// while this waited (for the share's pace or for the turn); nothing is
    /// admitted, and the caller defers.
    pub(super) async fn share(
        &self,
        (n, index): (u32, u32),
        outage: bool,
        engine: &str,
        host: &HostKey,
        deadline: Option<Instant>,
        request: RequestPacing,
    ) -> Result<Option<(Permit, Instant)>, Error> {
        let policies = self.fallback.policies();
        let (began, limiter) = self.shares.get(n, index, policies, outage, Instant::now());
        let gap = policies.pacing_for(host).min_delay();
        let mut from = after(began, gap);
        if let Some(last) = self.fallback.last_sent(host) {
            // `last` left in its turn: this replica's next turn begins n
            // gaps after that turn's start. The share admits a little
            // before it (the send then waits for the turn), so that a
            // runtime waking late still makes the turn, and the share's
            // own spacing, counted from this admission, does not carry
            // one turn's lateness into the next. Still more than one gap
            // after `last` (n >= 2): never twice in one turn.
            let lead = turn_lead(gap);
            from = from.max(after(last, gap.saturating_mul(n).saturating_sub(lead)));
        }
        let now = Instant::now();
        if from > now {
            limiter.penalize_host(host.clone(), from - now).await?;
        }
        // A cap on requests in flight the host stated is divided among the
        // replicas, and kept through the outage, also past its lapse here
        // (see `stated_cap`): the share holds this replica's part for as
        // long as the share lasts, and takes a new part when the host
        // states another cap. A replica whose part is none admits nothing
        // (the caller checked before it waited; the host may have stated
        // the cap since).
        let key = policies.key(host);
        if let Some((cap, _)) = self.stated_cap(&key) {
            let share = stated_share(cap, n, index);
            if share == 0 {
                return Ok(None);
            }
            if limiter.stated_cap(host).is_none_or(|(c, _)| c != share) {
                limiter.cap_host(host.clone(), share, Duration::MAX).await?;
            }
        }
        // A request heavier than this replica's share of the cap or quota
        // takes the whole share.
        let shared = limiter.policies().pacing_for(host);
        let most = heaviest(shared.max_concurrent(), shared.quota());
        let request = request.with_weight(request.weight().min(most));
        let permit = limiter
            .acquire_with(engine, host.clone(), deadline, request)
            .await?;
        // A moment late into its turn (as late as a send through the
        // primary may leave in it) is still the turn; later, the send
        // would crowd the next replica's turn, and waits for its next.
        let late = turn_window(policies.pacing_for(host)).unwrap_or_default();
        loop {
            let turn = after(
                Instant::now(),
                until_turn(gap, n, index, wall_clock(), late),
            );
            if let Some(deadline) = deadline
                && turn > deadline
            {
                // Not sent: the share's admission is taken back.
                permit.abandon();
                return Err(Error::WaitBudget {
                    host: host.to_string(),
                    wait: turn.saturating_duration_since(Instant::now()),
                    remaining: deadline.saturating_duration_since(Instant::now()),
                });
            }
            tokio::time::sleep_until(turn).await;
            if let Some(left) = turn_left(gap, n, index, wall_clock(), late) {
                // A cap stated while this request waited for its turn, of
                // which this replica's part is none: not sent.
                if self.no_part(&key, (n, index)).is_some() {
                    permit.abandon();
                    return Ok(None);
                }
                return Ok(Some((permit, after(Instant::now(), left))));
            }
            tracing::debug!(host = %host, "woke past this replica's turn: waiting for its next");
        }
    }
}
