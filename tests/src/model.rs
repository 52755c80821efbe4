//! A reference model of what the Redis scripts keep for one host and what they answer.
//!
//! The scripts in `crates/redislimit/src/redis/scripts/` are the heart of the promise
//! that replicas share one limit per host. This module states what they must do in plain
//! Rust, from the rules of docs/DESIGN.md rather than from the Lua: a host has a gate (no send
//! before `next`; in serialized mode one holder with a lease deadline), leases (lease
//! mode: one member per unit of weight, scored by deadline), admissions (the quota:
//! each one kept, or for large quotas counted in buckets), voided tokens (acquires
//! abandoned before they ran) and the waiting line across replicas (acquires told to
//! wait, each in line from its first refusal while it asks again in time, the earlier
//! ones going first). [`Model`] decides admit, wait or full for `acquire` and
//! answers `release`, abandon, `renew` and `penalize` exactly as the scripts reply, so
//! that the differential test (`tests/model/main.rs`) can run one sequence of
//! operations against both and demand the same answer at every step.
//!
//! Garbage (a key of the wrong type, an unparseable `next` or place in line) is part of
//! the model: a script that meets it replaces the host's state with a fresh hold (see
//! `heal` in `common.lua`), and which operations meet it depends on which keys they read;
//! what is replaced depends on which keys they are given (each script only the keys it
//! uses, as the limiter calls them).

use std::collections::BTreeMap;

/// Microseconds on the Redis clock.
pub type Us = i64;

/// The policy arguments every call of one sequence shares, as the scripts receive them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The cross-replica in-flight cap; 0 is serialized mode.
    pub cap: u32,
    /// The least gap between sends (and, serialized, after a completion).
    pub min_delay: Us,
    /// How long a slot stays booked without a renewal.
    pub lease_ttl: Us,
    /// Admissions allowed per `window`; 0 is no quota.
    pub quota: u32,
    /// The quota's sliding window.
    pub window: Us,
    /// The longest wait a refusal may ask for.
    pub max_wait: Us,
    /// A wait at most this long is booked at once, for a send at its end.
    pub horizon: Us,
    /// 0 when each admission is kept; else the width of the quota's buckets.
    pub bucket: Us,
}

/// One of a host's five keys, in the order the scripts take them (`KEYS[1..5]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// The hash: next, holder, busy and the booking record.
    Gate,
    /// The sorted set of leases (lease mode).
    Leases,
    /// The admissions of the quota: a sorted set, or a hash of buckets.
    Admits,
    /// The sorted set of voided tokens.
    Void,
    /// The hash of the waiting line: token -> `"<arrival> <by>"`.
    Waiting,
}

impl Key {
    /// All five, in `KEYS` order: what acquire and release are given.
    pub const ALL: [Key; 5] = [Key::Gate, Key::Leases, Key::Admits, Key::Void, Key::Waiting];
    /// What renew is given (and heals).
    pub const RENEW: [Key; 2] = [Key::Gate, Key::Leases];
    /// What adopt is given.
    pub const ADOPT: [Key; 3] = [Key::Gate, Key::Leases, Key::Admits];
    /// What penalize and backoff are given.
    pub const GATE: [Key; 1] = [Key::Gate];

    fn index(self) -> usize {
        self as usize
    }
}

/// What `acquire` answers, as the script's three integers.
pub type AcquireReply = [i64; 3];

/// A script met garbage: the host's state is to be replaced.
struct Garbage;

/// An entry of the waiting line, as the script parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In line since `arrival`; it lapses once the clock reaches `by` (the latest it
    /// was told it would ask again).
    Live { arrival: Us, by: Us },
    /// Text that does not parse (as a test writes with `HSET`).
    Unparseable,
}

/// What an acquire of a token with patience would find in the waiting line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Line {
    /// Live places before the token's (or before `now`, when it has none).
    pub ahead: usize,
    /// Places that lapsed, which the acquire drops.
    pub lapsed: usize,
}

/// The model of one host.
#[derive(Debug, Clone)]
pub struct Model {
    policy: Policy,
    /// No send before this (0 when unset).
    next: Us,
    /// The adaptive backoff gap (0 when not backing off).
    backoff: Us,
    /// Until when the backoff gap must be kept: a signal before then goes on from it.
    backoff_kept: Us,
    /// `next` holds something that is not a number.
    next_unparseable: bool,
    /// Serialized mode: the token sending now and its lease deadline.
    holder: Option<(String, Us)>,
    /// The latest admission that moved `next`, for an abandon to take back.
    booked: Option<String>,
    booked_next: Option<Us>,
    before: Option<Us>,
    /// A cap on requests in flight the host stated, and until when it holds
    /// (penalize.lua's cap mode): lease mode's cap is lowered to it meanwhile.
    stated: Option<(u32, Us)>,
    /// Lease members (`token`, `token#2`, ...) and their deadlines.
    leases: BTreeMap<String, Us>,
    /// Quota kept exactly: members and their admission instants.
    admits: BTreeMap<String, Us>,
    /// Quota in buckets: bucket number -> (units, latest admission).
    buckets: BTreeMap<i64, (i64, Us)>,
    /// Voided tokens and until when they matter.
    void: BTreeMap<String, Us>,
    /// The waiting line: token -> its place, lapsed ones included until an acquire
    /// with patience drops them.
    waiting: BTreeMap<String, Place>,
    /// Keys replaced by something of the wrong type.
    wrong_type: [bool; 5],
}

impl Model {
    /// A host nothing has been sent to.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            next: 0,
            backoff: 0,
            backoff_kept: 0,
            next_unparseable: false,
            holder: None,
            booked: None,
            booked_next: None,
            before: None,
            stated: None,
            leases: BTreeMap::new(),
            admits: BTreeMap::new(),
            buckets: BTreeMap::new(),
            void: BTreeMap::new(),
            waiting: BTreeMap::new(),
            wrong_type: [false; 5],
        }
    }

    /// The policy this host is run with.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// `key` now holds a value of the wrong type (as a test writes with `SET`).
    pub fn corrupt(&mut self, key: Key) {
        self.clear(key);
        self.wrong_type[key.index()] = true;
    }

    /// `key` no longer exists.
    fn clear(&mut self, key: Key) {
        self.wrong_type[key.index()] = false;
        match key {
            Key::Gate => {
                self.next = 0;
                self.backoff = 0;
                self.backoff_kept = 0;
                self.next_unparseable = false;
                self.holder = None;
                self.booked = None;
                self.booked_next = None;
                self.before = None;
                self.stated = None;
            }
            Key::Leases => self.leases.clear(),
            Key::Admits => {
                self.admits.clear();
                self.buckets.clear();
            }
            Key::Void => self.void.clear(),
            Key::Waiting => self.waiting.clear(),
        }
    }

    /// The gate's `next` now holds text that is not a number; its other fields stay.
    /// Does nothing when the gate is of the wrong type.
    pub fn corrupt_next(&mut self) {
        if !self.wrong_type[Key::Gate.index()] {
            self.next_unparseable = true;
        }
    }

    /// `token`'s place in the waiting line now holds text that does not parse. Does
    /// nothing when the line is of the wrong type.
    pub fn corrupt_place(&mut self, token: &str) {
        if !self.wrong_type[Key::Waiting.index()] {
            self.waiting.insert(token.to_owned(), Place::Unparseable);
        }
    }

    /// Whether a place in the waiting line holds text that does not parse.
    pub fn line_unparseable(&self) -> bool {
        self.waiting.values().any(|p| *p == Place::Unparseable)
    }

    /// When `token`'s place in the waiting line lapses; `None` when it has none (or
    /// its place does not parse).
    pub fn lapses(&self, token: &str) -> Option<Us> {
        match self.waiting.get(token) {
            Some(&Place::Live { by, .. }) => Some(by),
            _ => None,
        }
    }

    /// What an acquire of `token` with patience at `now` finds in the waiting line
    /// (nothing when it is garbage: the acquire heals it instead).
    pub fn line(&self, now: Us, token: &str) -> Line {
        if self.wrong_type[Key::Waiting.index()] || self.line_unparseable() {
            return Line::default();
        }
        let lapsed = self
            .waiting
            .iter()
            .filter(|(t, p)| *t != token && matches!(p, Place::Live { by, .. } if *by <= now))
            .count();
        Line {
            ahead: self.place(now, token).0,
            lapsed,
        }
    }

    /// How many live places of the line are before `token`'s, and when it joined
    /// (`now` when it has no place; its own place stands even when it lapsed, since
    /// asking again shows it is alive): a place is before another when it joined
    /// earlier, or at the same instant with a smaller token.
    fn place(&self, now: Us, token: &str) -> (usize, Us) {
        let live = |place: &Place| match *place {
            Place::Live { arrival, by } if by > now => Some(arrival),
            _ => None,
        };
        let arrival = match self.waiting.get(token) {
            Some(&Place::Live { arrival, .. }) => arrival,
            _ => now,
        };
        let ahead = self
            .waiting
            .iter()
            .filter_map(|(t, place)| live(place).map(|a| (a, t.as_str())))
            .filter(|&other| other < (arrival, token))
            .count();
        (ahead, arrival)
    }

    /// Whether `key` holds a value of the wrong type.
    pub fn is_corrupt(&self, key: Key) -> bool {
        self.wrong_type[key.index()]
    }

    /// When the slot `token` holds ends: its lease deadline, or in serialized mode its
    /// holder's; `None` when it holds none.
    pub fn deadline(&self, token: &str) -> Option<Us> {
        match &self.holder {
            Some((holder, busy)) if holder == token => Some(*busy),
            _ => self.leases.get(token).copied(),
        }
    }

    /// Whether the gate's `next` holds text that is not a number.
    pub fn gate_unparseable(&self) -> bool {
        self.next_unparseable
    }

    /// What the keys hold, in the terms a test can read back from Redis.
    pub fn state(&self) -> State {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        State {
            next: self.next,
            backoff: self.backoff,
            leases: count(self.leases.len()),
            admits: count(if self.policy.bucket == 0 {
                self.admits.len()
            } else {
                self.buckets.len()
            }),
            void: count(self.void.len()),
            waiting: count(self.waiting.len()),
        }
    }

    /// How long from `now` `key` must still exist for the state it holds to be kept
    /// (0 when nothing in it matters any more).
    pub fn needed(&self, key: Key, now: Us) -> Us {
        let until = match key {
            Key::Gate => {
                let next = if self.next_unparseable { 0 } else { self.next };
                let busy = match (&self.holder, self.policy.cap) {
                    (Some((_, busy)), 0) => busy + self.policy.min_delay,
                    _ => 0,
                };
                let backoff = if self.backoff > 0 {
                    self.backoff_kept
                } else {
                    0
                };
                let stated = self.stated.map_or(0, |(_, until)| until);
                next.max(busy).max(backoff).max(stated)
            }
            Key::Leases => self.leases.values().copied().max().unwrap_or(0),
            Key::Admits => {
                let exact = self.admits.values().copied().max();
                let bucketed = self.buckets.values().map(|&(_, latest)| latest).max();
                exact
                    .max(bucketed)
                    .map_or(0, |latest| latest + self.policy.window)
            }
            Key::Void => self.void.values().copied().max().unwrap_or(0),
            Key::Waiting => self
                .waiting
                .values()
                .filter_map(|place| match *place {
                    Place::Live { by, .. } => Some(by),
                    Place::Unparseable => None,
                })
                .max()
                .unwrap_or(0),
        };
        (until - now).max(0)
    }

    fn touch(&self, key: Key) -> Result<(), Garbage> {
        if self.wrong_type[key.index()] {
            Err(Garbage)
        } else {
            Ok(())
        }
    }

    fn next(&self) -> Result<Us, Garbage> {
        self.touch(Key::Gate)?;
        if self.next_unparseable {
            Err(Garbage)
        } else {
            Ok(self.next)
        }
    }

    /// Fresh state holding the host for `hold` from `now`, in the `keys` the script
    /// was given (the others keep what they hold, garbage included).
    fn heal(&mut self, now: Us, hold: Us, keys: &[Key]) {
        for &key in keys {
            self.clear(key);
        }
        self.next = now + hold;
    }

    /// `acquire` for `token` of `weight` at `now`, in the waiting line when `patience`
    /// (how long after its wait it will have asked again) is above 0, its send leaving
    /// up to `room` after its slot: `[1, now, ahead]` when admitted (to send `ahead`
    /// from now), `[0, wait, full]` when refused, `[0, 0, 2]` when the token was
    /// voided, `[0, lease_ttl, 3]` when garbage was replaced.
    pub fn acquire(
        &mut self,
        now: Us,
        token: &str,
        weight: u32,
        patience: Us,
        room: Us,
    ) -> AcquireReply {
        match self.try_acquire(now, token, weight, patience, room) {
            Ok(reply) => reply,
            Err(Garbage) => {
                let hold = self.policy.lease_ttl;
                self.heal(now, hold, &Key::ALL);
                [0, hold, 3]
            }
        }
    }

    fn try_acquire(
        &mut self,
        now: Us,
        token: &str,
        weight: u32,
        patience: Us,
        room: Us,
    ) -> Result<AcquireReply, Garbage> {
        let p = self.policy;
        let w = i64::from(weight);
        self.touch(Key::Void)?;
        let mut next = self.next()?;
        if p.cap != 0 {
            self.touch(Key::Leases)?;
        }
        if p.quota > 0 {
            self.touch(Key::Admits)?;
        }
        // Only an acquire with patience reads the line (and so meets its garbage).
        if patience > 0 {
            self.touch(Key::Waiting)?;
            if self.line_unparseable() {
                return Err(Garbage);
            }
        }

        // Leases past their deadline are free; admissions a window old no longer count.
        if p.cap != 0 {
            self.leases.retain(|_, deadline| *deadline > now);
        }
        if p.quota > 0 && p.bucket == 0 {
            self.admits.retain(|_, at| *at + p.window > now);
        }
        // Places whose waiter did not ask again in time are dropped, but not this
        // one's (it is asking), even when the token turns out voided.
        let (ahead, arrival) = if patience > 0 {
            self.waiting.retain(|t, place| {
                t == token || !matches!(place, Place::Live { by, .. } if *by <= now)
            });
            self.place(now, token)
        } else {
            (0, now)
        };
        let ahead = i64::try_from(ahead).unwrap_or(i64::MAX);
        if self.void.remove(token).is_some() {
            return Ok([0, 0, 2]);
        }

        let mut full = false;
        if p.cap == 0 {
            if let Some((_, busy)) = &self.holder {
                if *busy > now {
                    full = true;
                } else {
                    // A holder that died still owes the gap after its deadline.
                    next = next.max(busy + p.min_delay);
                }
            }
        } else if self.leases.len() as i64 + w > i64::from(self.cap_at(now, weight)) {
            full = true;
        }

        let mut wait = next - now;
        if p.quota > 0 {
            let room = i64::from(p.quota) - w;
            wait = wait.max(self.quota_wait(now, room));
        }

        // Earlier waiters go first. Without a gap in lease mode, each one ahead keeps a
        // slot of the cap; else this one is refused, told to wait a gap per waiter
        // ahead (or, serialized, as when full).
        let mut behind = false;
        if ahead > 0 && p.cap != 0 && p.min_delay == 0 {
            if self.leases.len() as i64 + ahead + w > i64::from(self.cap_at(now, weight)) {
                full = true;
            }
        } else if ahead > 0 {
            behind = true;
            if p.cap == 0 {
                full = true;
            } else if !full {
                wait = wait.max(0) + ahead * p.min_delay;
            }
        }
        if full || wait > p.horizon || behind {
            let wait = wait.max(0).min(p.max_wait);
            if patience > 0 {
                // In line (keeping its place, if it had one) until it was told it
                // would have asked again.
                let by = now + wait + patience;
                self.waiting
                    .insert(token.to_owned(), Place::Live { arrival, by });
            }
            return Ok([0, wait, i64::from(full)]);
        }

        // Admitted: out of line.
        if patience > 0 {
            self.waiting.remove(token);
        }
        let soon = wait.max(0);
        let at = now + soon;
        let before = next;
        // The send may leave up to `room` after its slot: in lease mode the next one
        // keeps the gap after that, and the quota counts it from then.
        let gap_room = if p.cap != 0 && p.min_delay > 0 {
            room
        } else {
            0
        };
        let next = next.max(at + p.min_delay + gap_room);
        let deadline = at + p.lease_ttl;
        if p.cap == 0 || next > now {
            self.next = next;
            self.booked = Some(token.to_owned());
            self.booked_next = Some(next);
            self.before = Some(before);
        }
        if p.cap == 0 {
            self.holder = Some((token.to_owned(), deadline));
        } else {
            for member in members(token, weight) {
                self.leases.insert(member, deadline);
            }
        }
        if p.quota > 0 {
            if p.bucket > 0 {
                // Buckets no longer counting go when another unit comes.
                let window = p.window;
                self.buckets
                    .retain(|_, &mut (_, latest)| latest + window > now);
            }
            self.count(token, weight, at + room);
        }
        Ok([1, now, soon])
    }

    /// The cap on requests in flight an acquire of `weight` at `now` is held to: in
    /// lease mode, a cap the host stated lowers the configured one while it holds, yet
    /// never below the request's weight (a heavier request goes alone).
    pub fn cap_at(&self, now: Us, weight: u32) -> u32 {
        let cap = self.policy.cap;
        match self.stated {
            Some((stated, until)) if cap != 0 && until > now && stated < cap => stated.max(weight),
            _ => cap,
        }
    }

    /// When the cap the host stated last lapses, if it stated one.
    pub fn stated_until(&self) -> Option<Us> {
        self.stated.map(|(_, until)| until)
    }

    /// `penalize` in its cap mode: the host states that it takes `cap` requests in
    /// flight for the next `hold` (the statement replaces the one before, whether
    /// longer or shorter). 1 when recorded, 0 for a cap below 1; garbage in the gate
    /// is replaced by a fresh hold, as `penalize` replaces it.
    pub fn state_cap(&mut self, now: Us, hold: Us, cap: u32) -> i64 {
        if self.next().is_err() {
            self.heal(now, hold.max(self.policy.lease_ttl), &Key::GATE);
            return 1;
        }
        if cap < 1 {
            return 0;
        }
        self.stated = Some((cap, now + hold));
        1
    }

    /// Counts `weight` units of `token` admitted at `at` in the quota.
    fn count(&mut self, token: &str, weight: u32, at: Us) {
        if self.policy.bucket == 0 {
            for member in members(token, weight) {
                self.admits.insert(member, at);
            }
        } else {
            let entry = self
                .buckets
                .entry(at.div_euclid(self.policy.bucket))
                .or_insert((0, at));
            entry.0 += i64::from(weight);
            entry.1 = entry.1.max(at);
        }
    }

    /// How long from `now` until at most `room` quota units count.
    fn quota_wait(&self, now: Us, room: i64) -> Us {
        let p = self.policy;
        // Each unit that counts, as the instant it stops counting, soonest first.
        let mut leaving: Vec<(Us, i64)> = if p.bucket == 0 {
            self.admits.values().map(|&at| (at + p.window, 1)).collect()
        } else {
            self.buckets
                .values()
                .filter(|&&(_, latest)| latest + p.window > now)
                .map(|&(units, latest)| (latest + p.window, units))
                .collect()
        };
        leaving.sort_unstable();
        let mut counted: i64 = leaving.iter().map(|&(_, units)| units).sum();
        if counted <= room {
            return 0;
        }
        for (gone, units) in leaving {
            counted -= units;
            if counted <= room {
                return gone - now;
            }
        }
        // Only a weight above the quota gets here (the limiter refuses it first).
        p.window
    }

    /// `release` (a completion) or, with `abandoned`, an abandon of `token` of `weight`,
    /// admitted at `admitted` (0: unknown). 1 when it still held its slot.
    pub fn release(
        &mut self,
        now: Us,
        token: &str,
        weight: u32,
        abandoned: bool,
        admitted: Us,
    ) -> i64 {
        match self.try_release(now, token, weight, abandoned, admitted) {
            Ok(reply) => reply,
            Err(Garbage) => {
                self.heal(now, self.policy.lease_ttl, &Key::ALL);
                0
            }
        }
    }

    fn try_release(
        &mut self,
        now: Us,
        token: &str,
        weight: u32,
        abandoned: bool,
        admitted: Us,
    ) -> Result<i64, Garbage> {
        let p = self.policy;
        let held = if p.cap != 0 {
            self.touch(Key::Leases)?;
            let mut any = false;
            for member in members(token, weight) {
                any |= self.leases.remove(&member).is_some();
            }
            any
        } else {
            self.touch(Key::Gate)?;
            self.holder.as_ref().is_some_and(|(t, _)| t == token)
        };

        if abandoned {
            // An acquire dropped while it waited leaves the line.
            self.touch(Key::Waiting)?;
            self.waiting.remove(token);
            // What it took of the quota is handed back.
            if p.bucket == 0 {
                self.touch(Key::Admits)?;
                for member in members(token, weight) {
                    self.admits.remove(&member);
                }
            } else if admitted > 0 && held {
                // Held no longer, it may have been handed back already (a
                // retried abandon): its unit stays counted.
                self.touch(Key::Admits)?;
                let bucket = admitted.div_euclid(p.bucket);
                if let Some(entry) = self.buckets.get_mut(&bucket) {
                    entry.0 -= i64::from(weight);
                    if entry.0 <= 0 {
                        self.buckets.remove(&bucket);
                    }
                }
            }
            if !held {
                // Its acquire may still arrive: it must then book nothing.
                self.touch(Key::Void)?;
                self.void.retain(|_, until| *until > now);
                self.void.insert(token.to_owned(), now + p.lease_ttl);
                return Ok(0);
            }
            // Never sent: the gap its booking opened closes, unless `next` moved since.
            self.touch(Key::Gate)?;
            if self.booked.as_deref() == Some(token) {
                let current = self.next()?;
                if self.booked_next == Some(current) {
                    self.next = self.before.unwrap_or(0);
                }
                self.booked = None;
                self.booked_next = None;
                self.before = None;
            }
        }

        if p.cap != 0 {
            // Lease mode spaces sends only: a completion moves nothing.
            return Ok(i64::from(held));
        }
        if !held {
            return Ok(0);
        }
        let next = self.next()?;
        self.holder = None;
        if !abandoned {
            // Serialized: the next send waits min_delay from this completion.
            self.next = next.max(now + p.min_delay);
        }
        Ok(1)
    }

    /// `renew` of `token` of `weight`: 1 when its lease was extended to `now + lease_ttl`.
    pub fn renew(&mut self, now: Us, token: &str, weight: u32) -> i64 {
        let p = self.policy;
        let key = if p.cap == 0 { Key::Gate } else { Key::Leases };
        if self.touch(key).is_err() {
            self.heal(now, p.lease_ttl, &Key::RENEW);
            return 0;
        }
        let deadline = now + p.lease_ttl;
        if p.cap == 0 {
            match &mut self.holder {
                Some((holder, busy)) if holder == token => {
                    *busy = deadline;
                    1
                }
                _ => 0,
            }
        } else if self.leases.contains_key(token) {
            for member in members(token, weight) {
                if let Some(d) = self.leases.get_mut(&member) {
                    *d = deadline;
                }
            }
            1
        } else {
            0
        }
    }

    /// `penalize` for `hold`: no send before `now + hold`. 1 when that extended the
    /// hold, 0 when a longer one was in place.
    pub fn penalize(&mut self, now: Us, hold: Us) -> i64 {
        let Ok(next) = self.next() else {
            self.heal(now, hold.max(self.policy.lease_ttl), &Key::GATE);
            return 1;
        };
        // A hold `next` already covers must outlast any abandon's rollback.
        self.booked = None;
        let until = now + hold;
        if until <= next {
            return 0;
        }
        self.next = until;
        1
    }

    /// `backoff`: an overload signal (`widen`) doubles the host's gap, from `start` up
    /// to `max`; a success narrows it to three quarters, dropping it below `start`. The
    /// host is held for the gap now in force (only ever extending `next`). Returns that
    /// gap, 0 when the host no longer backs off.
    pub fn backoff(&mut self, now: Us, widen: bool, start: Us, max: Us) -> i64 {
        let Ok(next) = self.next() else {
            self.heal(now, start.max(self.policy.lease_ttl), &Key::GATE);
            return if widen { start } else { 0 };
        };
        self.booked = None;
        let gap = if widen {
            (self.backoff * 2).max(start).min(max)
        } else {
            let narrowed = self.backoff * 3 / 4;
            if narrowed < start {
                self.backoff = 0;
                return 0;
            }
            narrowed
        };
        self.backoff = gap;
        self.backoff_kept = self.backoff_kept.max(now + gap.max(max));
        self.next = next.max(now + gap);
        gap
    }

    /// `adopt`: a request of `weight` sent `ago` before `now` without Redis (during an
    /// outage) is counted against the shared limits: it holds a slot from now (a lease,
    /// or the gate in serialized mode), the gap after its send is kept, and it counts in
    /// the quota while its send is inside the window. 0 when another live holder has
    /// the host in serialized mode (nothing is booked then).
    pub fn adopt(&mut self, now: Us, token: &str, weight: u32, ago: Us) -> i64 {
        match self.try_adopt(now, token, weight, ago) {
            Ok(reply) => reply,
            Err(Garbage) => {
                self.heal(now, self.policy.lease_ttl, &Key::ADOPT);
                0
            }
        }
    }

    fn try_adopt(&mut self, now: Us, token: &str, weight: u32, ago: Us) -> Result<i64, Garbage> {
        let p = self.policy;
        let next = self.next()?;
        self.booked = None;
        let sent = now - ago;
        let next = next.max(sent + p.min_delay);
        if p.cap == 0
            && let Some((holder, busy)) = &self.holder
            && holder != token
            && *busy > now
        {
            return Ok(0);
        }
        let deadline = now + p.lease_ttl;
        if p.cap == 0 {
            self.next = next;
            self.holder = Some((token.to_owned(), deadline));
        } else {
            if next > now {
                self.next = next;
            }
            self.touch(Key::Leases)?;
            for member in members(token, weight) {
                self.leases.insert(member, deadline);
            }
        }
        if p.quota > 0 && sent + p.window > now {
            self.touch(Key::Admits)?;
            self.count(token, weight, sent);
        }
        Ok(1)
    }
}

/// What a host's keys hold, as a test reads it back: the gate's `next`, the members of
/// the leases, the admissions (members, or buckets when bucketed), the voided tokens and
/// the places in the waiting line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The gate's `next` (0 when unset).
    pub next: Us,
    /// The gate's backoff gap (0 when unset).
    pub backoff: Us,
    /// Members of the leases set.
    pub leases: i64,
    /// Members of the admissions set, or buckets of the admissions hash.
    pub admits: i64,
    /// Members of the void set.
    pub void: i64,
    /// Fields of the waiting line (lapsed places an acquire has not dropped yet and
    /// unparseable ones included).
    pub waiting: i64,
}

/// The members a request of `weight` is kept as: its token, then `token#2` ...
pub fn members(token: &str, weight: u32) -> Vec<String> {
    std::iter::once(token.to_owned())
        .chain((2..=weight).map(|i| format!("{token}#{i}")))
        .collect()
}
