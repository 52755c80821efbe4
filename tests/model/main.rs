//! The scripts against the reference model ([`redislimit_tests::model`]): sequences of
//! acquire, release, abandon, renew, penalize, backoff and adopt from several tokens, and
//! caps on requests in flight the host states, with clock
//! advances and garbage written into the keys, run against the real scripts on a real
//! `redis-server` and against the model. Every reply (admit, wait and how long, full,
//! voided, healed), the state each call leaves (`next`, the sizes of the sets and of the
//! waiting line) and every key's expiry (it outlives the state it protects) must agree,
//! step by step. Acquires draw a patience (0: out of the waiting line), so that places
//! in line are kept, lapse and are taken over; each script is given the keys the
//! limiter gives it, which are the keys a heal replaces.
//!
//! The clock: the scripts read the server's `TIME` in `clock()` (common.lua). Here each
//! script is loaded with a test-only prelude between common.lua and the operation that
//! defines `clock()` again, reading the microseconds from the key [`CLOCK`], which the
//! test sets before every call. The prelude exists only in this file; the library's
//! scripts and the sources it loads are untouched, so release builds have no way to
//! set the clock.
//!
//! Both ways the limiter runs the scripts are checked: as one function library called
//! with `FCALL` (built by the library's own code, [`library::function_library`], with
//! the prelude after the helpers), and as scripts called with `EVALSHA`.
//!
//! `REDISLIMIT_MODEL_CASES` sets the number of sequences (2,000 by default); a longer
//! run is `REDISLIMIT_MODEL_CASES=100000 cargo xtask test --test model`.
//!
//! The test of the test: [`a_broken_script_is_caught`] runs the same property against
//! copies of the scripts with one deliberate bug each (an off-by-one in the quota
//! window, a missing void check, a dead holder's gap forgotten or kept a microsecond
//! too long, a lease taken back late or counted after it lapsed, expiries without
//! their slack; in the waiting
//! line: a place kept a microsecond too long or lapsing without its patience, the line's
//! expiry cut short by a newer place, ties not
//! broken, a place lost on asking again or kept after admission or after an abandon,
//! one gap for all the waiters ahead, no slots kept for them, the line read without
//! patience, an unparseable place not healed; a stated cap not applied, applied at its
//! lapse, or refusing a request heavier than it) and demands that each is found.

use std::cell::RefCell;
use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use redislimit_tests::RedisServer;
use redislimit_tests::model::{AcquireReply, Key, Model, Policy, Us};
use redislimit_tests::resp::{Connection, DEFAULT_TIMEOUT, Reply};

#[path = "../../crates/redislimit/src/redis/scripts/library.rs"]
mod library;

const COMMON: &str = include_str!("../../crates/redislimit/src/redis/scripts/common.lua");
const ACQUIRE: &str = include_str!("../../crates/redislimit/src/redis/scripts/acquire.lua");
const RELEASE: &str = include_str!("../../crates/redislimit/src/redis/scripts/release.lua");
const RENEW: &str = include_str!("../../crates/redislimit/src/redis/scripts/renew.lua");
const PENALIZE: &str = include_str!("../../crates/redislimit/src/redis/scripts/penalize.lua");
const BACKOFF: &str = include_str!("../../crates/redislimit/src/redis/scripts/backoff.lua");
const ADOPT: &str = include_str!("../../crates/redislimit/src/redis/scripts/adopt.lua");

/// The key the test prelude reads the clock from.
const CLOCK: &str = "redislimit-model:clock";

/// Defines `clock()` again, after common.lua: the scripts' every later call reads it.
const PRELUDE: &str = "
-- Test only: the clock is the number in a key the test sets, not TIME.
local function clock()
  return tonumber(redis.call('GET', 'redislimit-model:clock'))
end
";

/// The host's keys, in `KEYS` order.
const KEYS: [&str; 5] = [
    "m{h}:gate",
    "m{h}:leases",
    "m{h}:admits",
    "m{h}:void",
    "m{h}:waiting",
];

/// The scripts, as the library has them or with one bug put in.
#[derive(Debug, Clone)]
struct Sources {
    common: String,
    acquire: String,
    release: String,
    renew: String,
    penalize: String,
    backoff: String,
    adopt: String,
}

impl Sources {
    fn real() -> Self {
        Self {
            common: COMMON.to_owned(),
            acquire: ACQUIRE.to_owned(),
            release: RELEASE.to_owned(),
            renew: RENEW.to_owned(),
            penalize: PENALIZE.to_owned(),
            backoff: BACKOFF.to_owned(),
            adopt: ADOPT.to_owned(),
        }
    }

    /// `source` (the file `name`) with `from` replaced by `to`; `from` must occur
    /// exactly once, so a change to the script cannot make the mutant the real thing.
    fn mutated(name: &str, source: &str, from: &str, to: &str) -> String {
        assert_eq!(
            source.matches(from).count(),
            1,
            "{name} no longer contains {from:?} once: update the mutant"
        );
        source.replace(from, to)
    }

    /// The real sources with one replacement in acquire.lua (see [`Self::mutated`]).
    fn acquire_with(from: &str, to: &str) -> Self {
        let acquire = Self::mutated("acquire.lua", ACQUIRE, from, to);
        Self {
            acquire,
            ..Self::real()
        }
    }

    /// The same for common.lua.
    fn common_with(from: &str, to: &str) -> Self {
        let common = Self::mutated("common.lua", COMMON, from, to);
        Self {
            common,
            ..Self::real()
        }
    }

    /// The same for release.lua.
    fn release_with(from: &str, to: &str) -> Self {
        let release = Self::mutated("release.lua", RELEASE, from, to);
        Self {
            release,
            ..Self::real()
        }
    }
}

/// How the scripts are run: the two ways the limiter runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// One function library, each operation an `FCALL`.
    Functions,
    /// Each operation a script of its own, run with `EVALSHA`.
    Scripts,
}

impl Path {
    const BOTH: [Self; 2] = [Self::Functions, Self::Scripts];
}

/// How to call a loaded operation: the command and the function's name or
/// the script's SHA-1.
struct Call {
    command: &'static str,
    name: String,
}

impl Call {
    /// The call on `keys` with `args`.
    fn with(&self, keys: &[&str], args: &[String]) -> Vec<String> {
        let mut c = vec![
            self.command.to_owned(),
            self.name.clone(),
            keys.len().to_string(),
        ];
        c.extend(keys.iter().map(|&k| k.to_owned()));
        c.extend_from_slice(args);
        c
    }
}

/// The loaded operations.
struct Loaded {
    acquire: Call,
    release: Call,
    renew: Call,
    penalize: Call,
    backoff: Call,
    adopt: Call,
}

/// Loads `sources`, each with the test's prelude after common.lua, to be run
/// the `path` way.
fn load(conn: &mut Connection, sources: &Sources, path: Path) -> Loaded {
    let common = format!("{}{PRELUDE}", sources.common);
    let ops = [
        ("acquire", &sources.acquire),
        ("release", &sources.release),
        ("renew", &sources.renew),
        ("penalize", &sources.penalize),
        ("backoff", &sources.backoff),
        ("adopt", &sources.adopt),
    ];
    let calls: Vec<Call> = match path {
        Path::Functions => {
            const NAME: &str = "redislimit_model";
            let ops: Vec<(&str, &str)> = ops.iter().map(|(op, b)| (*op, b.as_str())).collect();
            let source = library::function_library(NAME, &common, &ops);
            match conn
                .query(&["FUNCTION", "LOAD", "REPLACE", &source])
                .unwrap()
            {
                Reply::Bulk(Some(name)) if name == NAME => {}
                other => panic!("FUNCTION LOAD failed: {other:?}"),
            }
            ops.iter()
                .map(|(op, _)| Call {
                    command: "FCALL",
                    name: format!("{NAME}_{op}"),
                })
                .collect()
        }
        Path::Scripts => ops
            .iter()
            .map(|(_, body)| {
                let source = format!("{common}{body}");
                match conn.query(&["SCRIPT", "LOAD", &source]).unwrap() {
                    Reply::Bulk(Some(sha)) => Call {
                        command: "EVALSHA",
                        name: sha,
                    },
                    other => panic!("SCRIPT LOAD failed: {other:?}"),
                }
            })
            .collect(),
    };
    let [acquire, release, renew, penalize, backoff, adopt]: [Call; 6] =
        calls.try_into().ok().expect("six operations");
    Loaded {
        acquire,
        release,
        renew,
        penalize,
        backoff,
        adopt,
    }
}

#[derive(Debug, Clone, Copy)]
enum Sleep {
    /// As long as the last acquire said (its wait, or how far ahead its slot was).
    AsTold,
    /// One microsecond less than that.
    JustShort,
    /// To the end of the slot a request holds (its lease or holder deadline), or a
    /// microsecond before it.
    ToDeadline { req: usize, short: bool },
    /// To when a request's place in the waiting line lapses, or a microsecond before.
    ToLapse { req: usize, short: bool },
    /// To when a cap the host stated lapses, or a microsecond before.
    ToCapLapse { short: bool },
    /// A given time.
    By(Us),
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// With `patience` above 0, in the waiting line while refused.
    Acquire {
        req: usize,
        patience: Us,
        /// How late after its slot its send may leave (as its process measured).
        room: Us,
    },
    Release(usize),
    /// With `known`, the caller saw the admission and passes its instant.
    Abandon {
        req: usize,
        known: bool,
    },
    Renew(usize),
    Penalize(Us),
    /// The host states a cap on requests in flight for a while (penalize.lua's cap
    /// mode, as a `RateLimit-Policy` with `qu="concurrent-requests"` gives it).
    StateCap {
        cap: u32,
        hold: Us,
    },
    /// An overload signal (widen) or a success (narrow) for the adaptive backoff.
    Backoff {
        widen: bool,
    },
    /// A request sent this long ago without Redis is counted.
    Adopt {
        req: usize,
        ago: Us,
    },
    Sleep(Sleep),
    Corrupt(Key),
    CorruptNext,
    /// A request's place in the waiting line is overwritten with text.
    CorruptPlace(usize),
}

/// What acquire.lua sends for the model's `reply`: an admission at once is the
/// Redis clock alone (an integer, not a table: the cheaper reply).
fn wire(reply: AcquireReply) -> Vec<i64> {
    match reply {
        [1, now, 0] => vec![now],
        other => other.to_vec(),
    }
}

/// One sequence: a policy, the weights of its requests, where the clock starts, and
/// what happens.
#[derive(Debug, Clone)]
struct Case {
    policy: Policy,
    /// The adaptive backoff's first and largest gap.
    backoff: (Us, Us),
    weights: Vec<u32>,
    start: Us,
    ops: Vec<Op>,
}

const REQUESTS: usize = 4;

fn policy() -> impl Strategy<Value = Policy> {
    (
        0u32..=3,
        prop_oneof![Just(0i64), 1i64..=4_000],
        1_000i64..=20_000,
        prop_oneof![Just(0u32), 1u32..=4, 17u32..=24],
        1_000i64..=40_000,
        1_000i64..=60_000,
        prop_oneof![Just(0i64), 1i64..=4_000],
    )
        .prop_map(
            |(cap, min_delay, lease_ttl, quota, window, max_wait, horizon)| Policy {
                cap,
                // Serialized mode needs a gap (the limiter refuses 0).
                min_delay: if cap == 0 {
                    min_delay.max(1)
                } else {
                    min_delay
                },
                lease_ttl,
                quota,
                window,
                max_wait,
                horizon,
                // As the limiter chooses: buckets above 16 per window, 32 of them.
                bucket: if quota > 16 { (window + 31) / 32 } else { 0 },
            },
        )
}

/// How long after its wait an acquire says it will have asked again: half the time 0,
/// out of the line (as the limiter sends for requests heavier than 1), else as long as
/// the short sleeps (so that places lapse between two asks) or the long ones (so that
/// they are kept across a wait or two). Drawn whatever the weight: the script takes
/// any request into the line it is given a patience for.
fn patience() -> impl Strategy<Value = Us> {
    prop_oneof![
        4 => Just(0i64),
        2 => 1i64..=10,
        2 => 1i64..=30_000,
    ]
}

/// The room an acquire asks for its lateness: mostly none (a process on time), else
/// up to a few gaps.
fn room() -> impl Strategy<Value = Us> {
    prop_oneof![
        3 => Just(0i64),
        1 => 1i64..=8_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let req = 0..REQUESTS;
    prop_oneof![
        20 => (req.clone(), patience(), room())
            .prop_map(|(req, patience, room)| Op::Acquire { req, patience, room }),
        6 => req.clone().prop_map(Op::Release),
        6 => (req.clone(), any::<bool>()).prop_map(|(req, known)| Op::Abandon { req, known }),
        4 => req.prop_map(Op::Renew),
        2 => (0i64..=20_000).prop_map(Op::Penalize),
        4 => (
            prop_oneof![1 => Just(0u32), 6 => 1u32..=2, 2 => 3u32..=4],
            0i64..=40_000
        )
            .prop_map(|(cap, hold)| Op::StateCap { cap, hold }),
        2 => any::<bool>().prop_map(|widen| Op::Backoff { widen }),
        2 => (0..REQUESTS, 0i64..=40_000).prop_map(|(req, ago)| Op::Adopt { req, ago }),
        10 => Just(Op::Sleep(Sleep::AsTold)),
        4 => Just(Op::Sleep(Sleep::JustShort)),
        6 => prop_oneof![1i64..=10, 0i64..=30_000].prop_map(|d| Op::Sleep(Sleep::By(d))),
        3 => (0..REQUESTS, any::<bool>())
            .prop_map(|(req, short)| Op::Sleep(Sleep::ToDeadline { req, short })),
        2 => (0..REQUESTS, any::<bool>())
            .prop_map(|(req, short)| Op::Sleep(Sleep::ToLapse { req, short })),
        2 => any::<bool>().prop_map(|short| Op::Sleep(Sleep::ToCapLapse { short })),
        1 => prop_oneof![
            Just(Key::Gate),
            Just(Key::Leases),
            Just(Key::Admits),
            Just(Key::Void),
            Just(Key::Waiting)
        ]
        .prop_map(Op::Corrupt),
        1 => Just(Op::CorruptNext),
        1 => (0..REQUESTS).prop_map(Op::CorruptPlace),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    policy().prop_flat_map(|policy| {
        // The heaviest request the limiter lets through: one slot in serialized mode,
        // else no more than the cap or the quota.
        let heaviest = match (policy.cap, policy.quota) {
            (0, _) => 1,
            (cap, 0) => cap,
            (cap, quota) => cap.min(quota),
        };
        (
            Just(policy),
            (100i64..=5_000, 0i64..=15_000).prop_map(|(start, more)| (start, start + more)),
            prop::collection::vec(1..=heaviest, REQUESTS),
            // Around the real clock's microseconds, so the numbers are as large as TIME's.
            1_700_000_000_000_000i64..1_800_000_000_000_000,
            prop::collection::vec(op(), 1..48),
        )
            .prop_map(|(policy, backoff, weights, start, ops)| Case {
                policy,
                backoff,
                weights,
                start,
                ops,
            })
    })
}

/// How often each kind of answer was seen over a run.
#[derive(Debug, Default)]
struct Seen {
    admitted: usize,
    booked_ahead: usize,
    waited: usize,
    full: usize,
    voided: usize,
    healed: usize,
    released: usize,
    renewed: usize,
    penalized: usize,
    /// Acquires refused as full while a cap the host stated lowered the
    /// configured one.
    stated_full: usize,
    backed_off: usize,
    adopted: usize,
    /// Refusals that put (or kept) the request in the waiting line.
    joined: usize,
    /// Acquires that found live places before theirs.
    behind: usize,
    /// Acquires that dropped lapsed places.
    lapsed: usize,
}

fn token(req: usize) -> String {
    format!("{:02x}", req + 0xa0)
}

fn int(reply: &Reply) -> Option<i64> {
    match reply {
        Reply::Integer(n) => Some(*n),
        Reply::Bulk(None) => Some(0),
        Reply::Bulk(Some(text)) => text.parse().ok(),
        _ => None,
    }
}

/// Runs `case` against the model and the scripts `loaded`, failing at the first
/// disagreement.
fn run(
    conn: &mut Connection,
    loaded: &Loaded,
    case: &Case,
    seen: &mut Seen,
) -> Result<(), TestCaseError> {
    let p = case.policy;
    let mut model = Model::new(p);
    let mut now = case.start;
    let mut told: Us = 0;
    let mut admitted_at: HashMap<usize, Us> = HashMap::new();
    let started = std::time::Instant::now();
    let flush = conn.query(&["FLUSHDB"]).unwrap();
    prop_assert_eq!(flush, Reply::Simple("OK".into()));

    for (step, &op) in case.ops.iter().enumerate() {
        let mut call: Vec<String> = Vec::new();
        // Each script gets the keys the limiter gives it: what a heal replaces.
        let eval = |call: &Call, keys: &[Key], args: &[String]| -> Vec<String> {
            let keys: Vec<&str> = keys.iter().map(|&k| KEYS[k as usize]).collect();
            call.with(&keys, args)
        };
        let weight = |req: usize| case.weights[req];
        let s = |n: i64| n.to_string();
        // What the model answers, and the call that asks the script the same.
        let expected: Vec<i64> = match op {
            Op::Acquire {
                req,
                patience,
                room,
            } => {
                let w = weight(req);
                call = eval(
                    &loaded.acquire,
                    &Key::ALL,
                    &[
                        token(req),
                        s(p.min_delay),
                        s(p.cap.into()),
                        s(p.lease_ttl),
                        s(p.quota.into()),
                        s(p.window),
                        s(p.max_wait),
                        s(w.into()),
                        s(p.horizon),
                        s(p.bucket),
                        s(patience),
                        s(room),
                    ],
                );
                if patience > 0 {
                    let line = model.line(now, &token(req));
                    seen.behind += usize::from(line.ahead > 0);
                    seen.lapsed += usize::from(line.lapsed > 0);
                }
                let lowered = model.cap_at(now, w) < p.cap;
                let reply = model.acquire(now, &token(req), w, patience, room);
                seen.stated_full += usize::from(lowered && reply[0] == 0 && reply[2] == 1);
                match reply {
                    [1, _, ahead] => {
                        told = ahead;
                        // Where a bucketed quota counted it.
                        admitted_at.insert(req, now + ahead + room);
                        seen.admitted += 1;
                        if ahead > 0 {
                            seen.booked_ahead += 1;
                        }
                    }
                    [0, wait, kind] => {
                        told = wait;
                        seen.joined += usize::from(patience > 0 && kind < 2);
                        match kind {
                            0 => seen.waited += 1,
                            1 => seen.full += 1,
                            2 => seen.voided += 1,
                            _ => seen.healed += 1,
                        }
                    }
                    _ => unreachable!("the model answers 0 or 1"),
                }
                wire(reply)
            }
            Op::Release(req) | Op::Abandon { req, .. } => {
                let abandoned = matches!(op, Op::Abandon { .. });
                let at = match op {
                    Op::Abandon { known: true, .. } => admitted_at.get(&req).copied().unwrap_or(0),
                    _ => 0,
                };
                let w = weight(req);
                call = eval(
                    &loaded.release,
                    &Key::ALL,
                    &[
                        token(req),
                        s(p.min_delay),
                        s(p.cap.into()),
                        s(i64::from(abandoned)),
                        s(p.lease_ttl),
                        s(w.into()),
                        s(p.bucket),
                        s(at),
                    ],
                );
                let held = model.release(now, &token(req), w, abandoned, at);
                seen.released += usize::try_from(held).unwrap_or(0);
                vec![held]
            }
            Op::Renew(req) => {
                let w = weight(req);
                call = eval(
                    &loaded.renew,
                    &Key::RENEW,
                    &[
                        token(req),
                        s(p.cap.into()),
                        s(p.lease_ttl),
                        s(p.min_delay),
                        s(w.into()),
                    ],
                );
                let renewed = model.renew(now, &token(req), w);
                seen.renewed += usize::try_from(renewed).unwrap_or(0);
                vec![renewed]
            }
            Op::Penalize(hold) => {
                call = eval(&loaded.penalize, &Key::GATE, &[s(hold), s(p.lease_ttl)]);
                let extended = model.penalize(now, hold);
                seen.penalized += usize::try_from(extended).unwrap_or(0);
                vec![extended]
            }
            Op::StateCap { cap, hold } => {
                call = eval(
                    &loaded.penalize,
                    &Key::GATE,
                    &[s(hold), s(p.lease_ttl), "2".to_owned(), s(cap.into())],
                );
                vec![model.state_cap(now, hold, cap)]
            }
            Op::Backoff { widen } => {
                let (start, max) = case.backoff;
                call = eval(
                    &loaded.backoff,
                    &Key::GATE,
                    &[
                        s(if widen { 1 } else { 2 }),
                        s(start),
                        s(max),
                        s(p.lease_ttl),
                    ],
                );
                let gap = model.backoff(now, widen, start, max);
                seen.backed_off += usize::from(gap > 0);
                vec![gap]
            }
            Op::Adopt { req, ago } => {
                let w = weight(req);
                call = eval(
                    &loaded.adopt,
                    &Key::ADOPT,
                    &[
                        token(req),
                        s(p.cap.into()),
                        s(p.lease_ttl),
                        s(p.min_delay),
                        s(ago),
                        s(p.quota.into()),
                        s(p.window),
                        s(w.into()),
                        s(p.bucket),
                    ],
                );
                let adopted = model.adopt(now, &token(req), w, ago);
                seen.adopted += usize::try_from(adopted).unwrap_or(0);
                vec![adopted]
            }
            Op::Sleep(sleep) => {
                now += match sleep {
                    Sleep::AsTold => told,
                    Sleep::JustShort => (told - 1).max(0),
                    Sleep::By(d) => d,
                    Sleep::ToDeadline { req, short } => model
                        .deadline(&token(req))
                        .map_or(0, |end| (end - now - i64::from(short)).max(0)),
                    Sleep::ToLapse { req, short } => model
                        .lapses(&token(req))
                        .map_or(0, |by| (by - now - i64::from(short)).max(0)),
                    Sleep::ToCapLapse { short } => model
                        .stated_until()
                        .map_or(0, |until| (until - now - i64::from(short)).max(0)),
                };
                Vec::new()
            }
            Op::Corrupt(key) => {
                model.corrupt(key);
                call = ["SET", KEYS[key as usize], "garbage"]
                    .map(str::to_owned)
                    .to_vec();
                Vec::new()
            }
            Op::CorruptNext => {
                model.corrupt_next();
                call = ["HSET", KEYS[0], "next", "not-a-number"]
                    .map(str::to_owned)
                    .to_vec();
                Vec::new()
            }
            Op::CorruptPlace(req) => {
                model.corrupt_place(&token(req));
                call = vec![
                    "HSET".to_owned(),
                    KEYS[4].to_owned(),
                    token(req),
                    "not-a-place".to_owned(),
                ];
                Vec::new()
            }
        };

        // One round trip: the clock, the call, then what the state looks like after it.
        let now_text = now.to_string();
        let mut commands: Vec<Vec<&str>> = vec![vec!["SET", CLOCK, &now_text]];
        let calls = !call.is_empty();
        if calls {
            commands.push(call.iter().map(String::as_str).collect());
        }
        for key in KEYS {
            commands.push(vec!["PTTL", key]);
        }
        commands.push(vec!["HGET", KEYS[0], "next"]);
        commands.push(vec!["HGET", KEYS[0], "backoff"]);
        commands.push(vec!["ZCARD", KEYS[1]]);
        commands.push(vec!["ZCARD", KEYS[3]]);
        commands.push(vec!["HLEN", KEYS[4]]);
        if p.bucket == 0 {
            commands.push(vec!["ZCARD", KEYS[2]]);
        } else {
            commands.push(vec!["HLEN", KEYS[2]]);
        }
        let replies = conn.pipeline(&commands).unwrap();
        let mut replies = replies.into_iter().skip(1);
        let context = || format!("step {step} ({op:?}) of {case:#?}");

        if calls {
            let reply = replies.next().unwrap();
            if !expected.is_empty() {
                let got: Option<Vec<i64>> = match &reply {
                    Reply::Integer(n) => Some(vec![*n]),
                    Reply::Array(Some(items)) => items.iter().map(int).collect(),
                    _ => None,
                };
                prop_assert_eq!(
                    got.as_deref(),
                    Some(expected.as_slice()),
                    "the script answered {:?}, the model {:?} at {}",
                    reply,
                    expected,
                    context()
                );
            }
        }

        let pttls: Vec<Reply> = replies.by_ref().take(KEYS.len()).collect();
        for (key, pttl) in Key::ALL.into_iter().zip(&pttls) {
            // A test's HSET of garbage may have made the key, without an expiry.
            let corrupt = model.is_corrupt(key)
                || (key == Key::Gate && model.gate_unparseable())
                || (key == Key::Waiting && model.line_unparseable());
            if corrupt {
                continue;
            }
            let pttl = int(pttl).unwrap_or(-3);
            prop_assert!(pttl != -1, "{key:?} has no expiry at {}", context());
            let needed = model.needed(key, now);
            if needed > 0 {
                // Every expiry outlives the state by a second of slack (for a replica
                // whose clock trails its master's), less the real time this sequence has
                // taken so far (the test's clock does not move the server's expiries).
                let spent = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
                prop_assert!(
                    (pttl + spent + 5) * 1000 >= needed + 1_000_000,
                    "{key:?} expires in {pttl} ms but its state matters for {needed} µs \
                     and a second more, at {}",
                    context()
                );
            }
        }

        let [next, backoff, leases, void, waiting, admits]: [Reply; 6] =
            replies.collect::<Vec<_>>().try_into().unwrap();
        let state = model.state();
        if !model.is_corrupt(Key::Gate) && !model.gate_unparseable() {
            prop_assert_eq!(int(&next), Some(state.next), "next at {}", context());
            prop_assert_eq!(
                int(&backoff),
                Some(state.backoff),
                "backoff at {}",
                context()
            );
        }
        if !model.is_corrupt(Key::Leases) {
            prop_assert_eq!(int(&leases), Some(state.leases), "leases at {}", context());
        }
        if !model.is_corrupt(Key::Void) {
            prop_assert_eq!(int(&void), Some(state.void), "voids at {}", context());
        }
        if !model.is_corrupt(Key::Admits) {
            prop_assert_eq!(int(&admits), Some(state.admits), "admits at {}", context());
        }
        if !model.is_corrupt(Key::Waiting) {
            prop_assert_eq!(
                int(&waiting),
                Some(state.waiting),
                "the waiting line at {}",
                context()
            );
        }
    }
    Ok(())
}

/// Runs `cases` sequences against `sources`, run the `path` way, on a fresh server; the error is the
/// smallest failing sequence proptest found.
fn check(
    sources: &Sources,
    path: Path,
    cases: u32,
    rng: Option<TestRng>,
) -> (Result<(), TestError<Case>>, Seen) {
    let server = RedisServer::start();
    let conn = RefCell::new(Connection::open(server.addr(), DEFAULT_TIMEOUT).unwrap());
    let loaded = load(&mut conn.borrow_mut(), sources, path);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    };
    let mut runner = match rng {
        Some(rng) => TestRunner::new_with_rng(config, rng),
        None => TestRunner::new(config),
    };
    let seen = RefCell::new(Seen::default());
    let result = runner.run(&case(), |case| {
        run(
            &mut conn.borrow_mut(),
            &loaded,
            &case,
            &mut seen.borrow_mut(),
        )
    });
    (result, seen.into_inner())
}

/// `REDISLIMIT_MODEL_CASES`, 2,000 when unset; a value that is not a
/// positive number fails the test rather than quietly running the default.
fn cases() -> u32 {
    match std::env::var("REDISLIMIT_MODEL_CASES") {
        Err(std::env::VarError::NotPresent) => 2_000,
        Ok(n) => match n.trim().parse::<u32>() {
            Ok(n) if n > 0 => n,
            _ => panic!("REDISLIMIT_MODEL_CASES={n:?} is not a positive number of sequences"),
        },
        Err(err) => panic!("REDISLIMIT_MODEL_CASES is unreadable: {err}"),
    }
}

/// The scripts as the limiter runs them where the server has functions.
#[test]
fn the_functions_answer_as_the_model_does() {
    answers_as_the_model_does(Path::Functions);
}

/// The scripts as the limiter runs them where it has no functions.
#[test]
fn the_scripts_answer_as_the_model_does() {
    answers_as_the_model_does(Path::Scripts);
}

fn answers_as_the_model_does(path: Path) {
    let cases = cases();
    let (result, seen) = check(&Sources::real(), path, cases, None);
    if let Err(failure) = result {
        panic!("{path:?}: the scripts and the model disagree: {failure}");
    }
    println!("{path:?}, {cases} sequences: {seen:?}");
    // The sequences reached every kind of answer, many times over.
    let floor = usize::try_from(cases / 20).unwrap();
    for (what, n) in [
        ("admitted", seen.admitted),
        ("booked ahead", seen.booked_ahead),
        ("told to wait", seen.waited),
        ("refused as full", seen.full),
        ("voided", seen.voided),
        ("healed", seen.healed),
        ("released while held", seen.released),
        ("renewed", seen.renewed),
        ("penalized", seen.penalized),
        ("refused under a stated cap", seen.stated_full),
        ("backing off", seen.backed_off),
        ("adopted", seen.adopted),
        ("in the waiting line", seen.joined),
        ("behind others in line", seen.behind),
        ("dropping lapsed places", seen.lapsed),
    ] {
        assert!(
            n >= floor,
            "only {n} answers {what} in {cases} sequences: {seen:?}"
        );
    }
}

/// The property fails on copies of the scripts with one bug each: it can fail.
#[test]
fn a_broken_script_is_caught() {
    let mutants = [
        (
            "the quota's window ends a microsecond early",
            Sources::acquire_with(
                "tonumber(oldest[2]) + window - now",
                "tonumber(oldest[2]) + window - now - 1",
            ),
        ),
        (
            "an abandoned acquire is not checked for",
            Sources::acquire_with("if voided then", "if false then"),
        ),
        (
            "a dead holder's gap is forgotten",
            Sources::acquire_with("nxt = math.max(nxt, busy + min_delay)", "nxt = nxt"),
        ),
        (
            "a lease is taken back a microsecond late",
            Sources::acquire_with(
                "pcall(trimmed_count, leases, now)",
                "pcall(trimmed_count, leases, now - 1)",
            ),
        ),
        (
            "lapsed leases and admissions are counted when their set is not empty",
            Sources::common_with(
                "return n - redis.call('ZREMRANGEBYSCORE', key, '-inf', int(upto))",
                "return n",
            ),
        ),
        (
            "a waiting line that was not empty gets the expiry of its newest place",
            Sources::acquire_with("now, not lined)", "now, true)"),
        ),
        (
            "a dead holder keeps the host a microsecond too long",
            Sources::acquire_with("if busy > now then", "if busy >= now then"),
        ),
        (
            "keys expire without the second of slack",
            Sources::common_with("math.ceil(us / 1000) + 1000", "math.ceil(us / 1000)"),
        ),
        (
            "a place in line is kept a microsecond too long",
            Sources::common_with("if b <= now then", "if b < now then"),
        ),
        (
            "waiters who joined at the same instant are not ordered",
            Sources::common_with(" or (e[2] == arrival and e[1] < token)", ""),
        ),
        (
            "an admitted acquire keeps its place in line",
            Sources::acquire_with("redis.call('HDEL', waiting, token)", ""),
        ),
        (
            "an abandoned acquire keeps its place in line",
            Sources::release_with("redis.call('HDEL', waiting, token)", ""),
        ),
        (
            "a waiter that asks again loses its place",
            Sources::common_with("arrival, present = a, true", "arrival, present = now, true"),
        ),
        (
            "the waiters ahead are owed one gap in all",
            Sources::acquire_with("ahead * min_delay", "min_delay"),
        ),
        (
            "the waiters ahead keep no slots of the cap",
            Sources::acquire_with(
                "in_flight + ahead + weight > cap",
                "in_flight + weight > cap",
            ),
        ),
        (
            "a place lapses when its wait ends, without the patience",
            Sources::acquire_with("now + wait + num(ARGV[11])", "now + wait"),
        ),
        (
            "an acquire without patience reads the line",
            Sources::acquire_with("if ok and in_line_wanted then", "if ok then"),
        ),
        (
            "a late waiter that asks again loses its place",
            Sources::common_with(
                "    if raw[i] == token then\n      arrival, present = a, true\n    elseif b <= now then\n      dead[#dead + 1] = raw[i]",
                "    if b <= now then\n      dead[#dead + 1] = raw[i]\n    elseif raw[i] == token then\n      arrival, present = a, true",
            ),
        ),
        (
            "an abandon sent again counts a bucket down twice",
            Sources::release_with(
                "elseif admitted > 0 and held then",
                "elseif admitted > 0 then",
            ),
        ),
        (
            "the next send is not kept clear of a late send's room",
            Sources::acquire_with("at + min_delay + gap_room", "at + min_delay"),
        ),
        (
            "the quota counts a late send from its slot, not from the end of its room",
            Sources::acquire_with(
                "zadd_all(admits, int(at + room)",
                "zadd_all(admits, int(at)",
            ),
        ),
        (
            "an unparseable place counts as lapsed",
            Sources::common_with(
                "if a == nil then\n      garbage()",
                "if a == nil then\n      a, b = '0', '0'",
            ),
        ),
        (
            "a cap the host stated is not applied",
            Sources::acquire_with("elseif stated < cap then", "elseif false then"),
        ),
        (
            "a request heavier than a cap the host stated is never admitted",
            Sources::acquire_with("cap = math.max(stated, weight)", "cap = stated"),
        ),
        (
            "a cap the host stated still holds when it lapses",
            Sources::acquire_with(
                "stated_until and stated_until > now then",
                "stated_until and stated_until >= now then",
            ),
        ),
    ];
    for (bug, sources) in mutants {
        for path in Path::BOTH {
            let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
            match check(&sources, path, 2_000, Some(rng)).0 {
                Err(TestError::Fail(reason, case)) => {
                    println!(
                        "{bug}, {path:?}: caught with {} steps: {reason}",
                        case.ops.len()
                    );
                }
                Err(other) => panic!("{bug}, {path:?}: the run ended without a verdict: {other}"),
                Ok(()) => panic!("{bug}, {path:?}: 2,000 sequences did not notice the bug"),
            }
        }
    }
}

/// The prelude sets the time for every script only while the scripts read it through
/// `clock()` alone: one `TIME` call in common.lua, none in the operations.
#[test]
fn the_scripts_read_the_time_only_through_clock() {
    let reads =
        |source: &str| source.matches("'TIME'").count() + source.matches("\"TIME\"").count();
    assert_eq!(reads(COMMON), 1, "common.lua reads TIME once, in clock()");
    for (name, source) in [
        ("acquire", ACQUIRE),
        ("release", RELEASE),
        ("renew", RENEW),
        ("penalize", PENALIZE),
        ("backoff", BACKOFF),
        ("adopt", ADOPT),
    ] {
        assert_eq!(reads(source), 0, "{name}.lua reads TIME itself");
        assert!(
            source.contains("clock()"),
            "{name}.lua takes its time from clock()"
        );
    }
}

/// The gap (µs) of the keep-out cases, and a turn's tolerance at it.
const TURN: i64 = 1_000;
const TOLERANCE: i64 = 100;

/// Whether a send at `t`, leaving up to `room` later, comes closer than `TURN` less the
/// tolerance to a send of a cut-off replica in one of its `turns` of `n`: a send in the
/// first `TOLERANCE` of a turn's slot (slot `k` starts at `k * TURN`).
fn in_keep_out(t: i64, room: i64, n: i64, turns: &[i64]) -> bool {
    // Lateness beyond the tolerance is the hand-back's to catch.
    let room = room.min(TOLERANCE);
    let period = n * TURN;
    turns.iter().any(|&i| {
        (t / period - 1..=t / period + 1).any(|k| {
            let start = k * period + i * TURN;
            // The cut-off send in [start, start + TOLERANCE].
            t + room > start - TURN + TOLERANCE && t < start + TURN
        })
    })
}

/// Runs three acquires at one instant on a free lease-mode host with the turns of
/// cut-off replicas given; checks each is booked at the earliest instant that keeps
/// clear of those turns and a gap (plus its room) after the previous one, or refused
/// when no such instant comes within two periods. `Err` names the first disagreement.
fn keep_out_case(
    conn: &mut Connection,
    acquire: &Call,
    now: i64,
    n: i64,
    turns: &[i64],
    room: i64,
) -> Result<(), String> {
    conn.query(&["FLUSHDB"]).unwrap();
    conn.query(&["SET", CLOCK, &now.to_string()]).unwrap();
    let mut earliest = now;
    for req in 0..3 {
        let mut args: Vec<String> = Vec::new();
        let period = n * TURN;
        for arg in [
            format!("t{req}"),
            TURN.to_string(),
            "10".into(),
            "60000000".into(),
            "0".into(),
            "0".into(),
            "600000000".into(),
            "1".into(),
            (4 * period).to_string(),
            "0".into(),
            "0".into(),
            room.to_string(),
            TOLERANCE.to_string(),
            n.to_string(),
        ] {
            args.push(arg);
        }
        args.extend(turns.iter().map(i64::to_string));
        let c = acquire.with(&KEYS, &args);
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        let at = match conn.query(&args).unwrap() {
            Reply::Integer(_) => Some(now),
            Reply::Array(Some(items)) => match items.as_slice() {
                [Reply::Integer(1), _, Reply::Integer(ahead)] => Some(now + ahead),
                [Reply::Integer(0), ..] => None,
                other => return Err(format!("unexpected reply {other:?}")),
            },
            other => return Err(format!("unexpected reply {other:?}")),
        };
        let want = (earliest..earliest + 2 * period).find(|&t| !in_keep_out(t, room, n, turns));
        if at != want {
            return Err(format!(
                "acquire {req}: booked at {at:?}, the earliest clear instant is {want:?}"
            ));
        }
        let Some(at) = at else { return Ok(()) };
        earliest = at + TURN + room;
    }
    Ok(())
}

/// The keep-out over 300 random cases (the instant, how many replicas, which of
/// them are cut off, the room) with `sources` run the `path` way; `Err` names the
/// first case that fails.
fn keep_out_cases(conn: &mut Connection, sources: &Sources, path: Path) -> Result<(), String> {
    let acquire = load(conn, sources, path).acquire;
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]);
    let mut below = |n: u64| (rng.next_u64() % n) as i64;
    for _ in 0..300 {
        let n = 2 + below(5);
        let own = below(n as u64);
        let picks = below(1 << n);
        let turns: Vec<i64> = (0..n)
            .filter(|&i| i != own && picks & (1 << i) != 0)
            .collect();
        if turns.is_empty() {
            continue;
        }
        let now = 1_000_000_000 + below(1_000_000);
        let room = [0, 40, 100, 250][below(4) as usize];
        keep_out_case(conn, &acquire, now, n, &turns, room)
            .map_err(|why| format!("n {n}, turns {turns:?}, now {now}, room {room}: {why}"))?;
    }
    Ok(())
}

/// While replicas cut off from Redis send on their own in their turns, acquire.lua
/// books every admission at the earliest instant that keeps `min_delay` less a turn's
/// tolerance from each of those turns (and from the admission before), or refuses it
/// when the turns leave no room; and three deliberate bugs in it are each caught.
#[test]
fn admissions_keep_clear_of_the_turns_of_cut_off_replicas() {
    let server = RedisServer::start();
    let mut conn = Connection::open(server.addr(), DEFAULT_TIMEOUT).unwrap();
    for path in Path::BOTH {
        keep_out_cases(&mut conn, &Sources::real(), path).unwrap();
    }
    for (bug, sources) in [
        (
            "the keep-out ignores the room of a late send",
            Sources::acquire_with(
                "if at + room > s - d + tol then",
                "if at > s - d + tol then",
            ),
        ),
        (
            "the keep-out ends a microsecond early",
            Sources::acquire_with("at = s + d\n", "at = s + d - 1\n"),
        ),
        (
            "the keep-out starts without the tolerance",
            Sources::acquire_with(
                "if at + room > s - d + tol then",
                "if at + room > s - d then",
            ),
        ),
    ] {
        for path in Path::BOTH {
            assert!(
                keep_out_cases(&mut conn, &sources, path).is_err(),
                "{bug}, {path:?}: 300 cases did not notice"
            );
        }
    }
}

/// How many acquires at one instant `sources`' acquire.lua (run the `path` way)
/// admits for a host that stated a cap of `stated` in flight, while the replicas of
/// turns `lapsed` among `n` are cut off from Redis, against the parts they keep of
/// it (turn `i`: `stated / n`, one more when `i < stated % n`, as the fallback's
/// `stated_share` gives them); `Err` names the first case that disagrees.
fn stated_cap_cases(conn: &mut Connection, sources: &Sources, path: Path) -> Result<(), String> {
    let acquire = load(conn, sources, path).acquire;
    let now: i64 = 1_000_000_000;
    for n in 2..=5i64 {
        for stated in 1..=7i64 {
            for picks in 1..(1i64 << n) {
                let lapsed: Vec<i64> = (0..n).filter(|i| picks & (1 << i) != 0).collect();
                let part = |i: i64| stated / n + i64::from(i < stated % n);
                let want = (stated - lapsed.iter().map(|&i| part(i)).sum::<i64>()).max(0);
                conn.query(&["FLUSHDB"]).unwrap();
                conn.query(&["SET", CLOCK, &now.to_string()]).unwrap();
                let until = (now + 1_000_000_000).to_string();
                let stated_text = stated.to_string();
                conn.query(&["HSET", KEYS[0], "cap", &stated_text, "cap_until", &until])
                    .unwrap();
                let mut admitted = 0;
                for req in 0..10 {
                    let mut args: Vec<String> = [
                        format!("t{req}"),
                        "0".into(),
                        "100".into(),
                        "60000000".into(),
                        "0".into(),
                        "0".into(),
                        "600000000".into(),
                        "1".into(),
                        "0".into(),
                        "0".into(),
                        "0".into(),
                        "0".into(),
                        TOLERANCE.to_string(),
                        n.to_string(),
                    ]
                    .into();
                    args.extend(lapsed.iter().map(i64::to_string));
                    let c = acquire.with(&KEYS, &args);
                    let c: Vec<&str> = c.iter().map(String::as_str).collect();
                    match conn.query(&c).unwrap() {
                        Reply::Integer(_) => admitted += 1,
                        Reply::Array(Some(items))
                            if matches!(
                                items.as_slice(),
                                [Reply::Integer(0), _, Reply::Integer(1)]
                            ) =>
                        {
                            break;
                        }
                        other => return Err(format!("unexpected reply {other:?}")),
                    }
                }
                if admitted != want {
                    return Err(format!(
                        "stated {stated}, n {n}, lapsed {lapsed:?}: {admitted} admitted, {want} left"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// While replicas cut off from Redis send on their own, acquire.lua takes their
/// parts of a cap the host stated off it, and admits nothing when none is left;
/// two deliberate bugs in it are each caught.
#[test]
fn a_stated_cap_leaves_the_cut_off_replicas_parts_free() {
    let server = RedisServer::start();
    let mut conn = Connection::open(server.addr(), DEFAULT_TIMEOUT).unwrap();
    for path in Path::BOTH {
        stated_cap_cases(&mut conn, &Sources::real(), path).unwrap();
    }
    for (bug, sources) in [
        (
            "the remainder goes to one turn too many",
            Sources::acquire_with(
                "if tonumber(ARGV[i]) < extra then",
                "if tonumber(ARGV[i]) <= extra then",
            ),
        ),
        (
            "with nothing left, one is admitted",
            Sources::acquire_with("none_left = true", "none_left = false"),
        ),
    ] {
        for path in Path::BOTH {
            assert!(
                stated_cap_cases(&mut conn, &sources, path).is_err(),
                "{bug}, {path:?}: the cases did not notice"
            );
        }
    }
}
