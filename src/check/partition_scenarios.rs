//! The scenarios of `hotsplit check --nemesis partition`, each a [`Scenario`] run by
//! [`Bench::run_scenario`]: the traffic of one key ([`super::partition_traffic`]) starts, the
//! scenario's nemesis cuts and heals, the writers stop at the heal, the run waits until every
//! copy holds the newest acknowledged version, the readers read on for a moment, and the
//! history becomes one row ([`super::partition_figures`]).
//!
//! The seed picks, per scenario, the instance, the master (so the key), and every cut's length
//! (the base length drawn within ±20 %) and the flapping's rhythm; the traffic's interleaving
//! comes from the same seed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::partition_figures::{
    figures, instance_id, lists, Judged, NemesisRecord, PartitionRow, RowSpec,
};
use super::partition_traffic::{Traffic, A, B};
use super::recorder::Recorder;
use hotsplit::error::{Error, ErrorKind, Result};
use hotsplit_devcluster::{NetNode, NodeInfo, Partition, Topology};

/// The family whose publishes wait for a replica (`sync_replicas = 1`), one copy.
pub(super) const RULE_FAMILY: &str = "pr:";

/// The family without the rule, one copy.
pub(super) const PLAIN_FAMILY: &str = "pn:";

/// How long the cluster may take to be healthy again before a scenario starts.
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// How long the split brain waits for B to serve the set-back copy before B publishes (B
/// publishes then anyway: the note says whether it served).
const SERVED_WITHIN: Duration = Duration::from_secs(3);

/// A settling longer than this is noted in the row.
const SETTLED_NOTE: Duration = Duration::from_millis(500);

/// How long the copies may take to converge after the heal.
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);

/// How long the majority may take to promote the isolated master's replica.
const FAILOVER_WITHIN: Duration = Duration::from_secs(30);

/// Traffic before the first cut, so every reader has a floor to keep.
const WARM_UP: Duration = Duration::from_millis(600);

/// How long the readers read on once the copies converged.
const READ_ON: Duration = Duration::from_millis(600);

/// How long the other instance may take to list a cut instance again after the heal.
const RELIST_WITHIN: Duration = Duration::from_secs(15);

/// The registry records' key (the instances' list); its slot names the registry master.
const REGISTRY_KEY: &[u8] = b"#hotsplit#{fleet}#instances";

/// What every scenario shares: the network and cluster, the instances, the client, the seed.
pub(super) struct Bench<'a> {
    /// The namespaced cluster, the instances' hosts and the driver.
    pub(super) topology: &'a Topology,
    /// `http://<ip>:<port>` of instance A and of instance B.
    pub(super) bases: [String; 2],
    /// The driver's HTTP client (each request bounded).
    pub(super) http: reqwest::Client,
    /// The run's seed.
    pub(super) seed: u64,
    /// The base length of a scenario's cut (drawn within ±20 % per cut).
    pub(super) cut: Duration,
    /// When the run started, for progress lines.
    pub(super) started: Instant,
}

/// One scenario: its row's name, its family, its nemesis.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scenario {
    /// An instance cut from the master of the key (both ways); nothing fails over.
    InstanceFromMaster,
    /// The key's master cut from its replica, in cuts shorter than `cluster-node-timeout`.
    MasterFromReplica,
    /// The key's master and instance A isolated from everyone else; the replica is promoted;
    /// B publishes; then the heal. `true`: under the rule.
    SplitBrain(bool),
    /// An instance cut from the master holding the registry records.
    InstanceFromRegistry,
    /// An instance cut from the key's master and healed again and again.
    Flapping,
}

impl Scenario {
    /// Every scenario, in the order a run makes them.
    pub(super) const ALL: [Scenario; 6] = [
        Scenario::InstanceFromMaster,
        Scenario::MasterFromReplica,
        Scenario::SplitBrain(true),
        Scenario::SplitBrain(false),
        Scenario::InstanceFromRegistry,
        Scenario::Flapping,
    ];

    /// The row's name.
    pub(super) fn name(self) -> &'static str {
        match self {
            Scenario::InstanceFromMaster => "instance cut from one master",
            Scenario::MasterFromReplica => "master cut from its replica",
            Scenario::SplitBrain(true) => "split brain, under the rule",
            Scenario::SplitBrain(false) => "split brain, without the rule",
            Scenario::InstanceFromRegistry => "instance cut from the registry master",
            Scenario::Flapping => "flapping cuts",
        }
    }

    /// Whether its family publishes under the rule (`sync_replicas = 1`).
    fn rule(self) -> bool {
        matches!(
            self,
            Scenario::MasterFromReplica | Scenario::SplitBrain(true)
        )
    }

    /// Whether its losses fail the run (all but the split brain without the rule, which shows
    /// the losses the rule prevents).
    fn judged(self) -> Judged {
        match self {
            Scenario::SplitBrain(false) => Judged::Shown,
            _ => Judged::Judged,
        }
    }

    /// Its number, the salt of its generator and part of its keys' names.
    fn index(self) -> u64 {
        match self {
            Scenario::InstanceFromMaster => 1,
            Scenario::MasterFromReplica => 2,
            Scenario::SplitBrain(true) => 3,
            Scenario::SplitBrain(false) => 4,
            Scenario::InstanceFromRegistry => 5,
            Scenario::Flapping => 6,
        }
    }
}

impl Bench<'_> {
    /// Prints one progress line on stderr.
    pub(super) fn progress(&self, what: &str) {
        eprintln!("[{:>6.1}s] {what}", self.started.elapsed().as_secs_f64());
    }

    /// Runs `scenario` and returns its row.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when the cluster does not heal, no key fits, or the network
    /// refuses a cut.
    pub(super) async fn run(&self, scenario: Scenario) -> Result<PartitionRow> {
        self.progress(&format!(
            "{}: waiting for a healthy cluster",
            scenario.name()
        ));
        let cluster = &self.topology.cluster;
        tokio::task::block_in_place(|| cluster.wait_healthy(HEALTHY_WITHIN))
            .map_err(unavailable)?;
        let mut rng = StdRng::seed_from_u64(self.seed ^ scenario.index().wrapping_mul(0x51_7CC1));
        let family = if scenario.rule() {
            RULE_FAMILY
        } else {
            PLAIN_FAMILY
        };
        let view = tokio::task::block_in_place(|| cluster.topology()).map_err(unavailable)?;
        let registry = cluster
            .master_for_key_in(&view, REGISTRY_KEY)
            .map_err(unavailable)?;
        let mut masters: Vec<&NetNode> = view
            .iter()
            .filter(|info| info.is_master() && !info.slots.is_empty() && !info.is_failed())
            .filter_map(|info| cluster.node_at(&info.host))
            .filter(|node| {
                !matches!(scenario, Scenario::InstanceFromRegistry)
                    || node.addr() != registry.addr()
            })
            .collect();
        // CLUSTER NODES lists in no fixed order: sort, so the seed picks the same master.
        masters.sort_by_key(|node| node.host().ip());
        let chosen = masters
            .get(rng.random_range(0..masters.len().max(1)))
            .copied()
            .ok_or_else(|| unavailable("no master serves slots"))?;
        let key = key_on(&view, cluster, family, scenario.index(), chosen)?;
        let door = if matches!(scenario, Scenario::SplitBrain(_)) {
            A
        } else {
            rng.random_range(A..=B)
        };
        let plan = Plan {
            scenario,
            key,
            master: chosen,
            registry,
            door,
        };
        let probe = key_on(&view, cluster, PLAIN_FAMILY, 100 + scenario.index(), chosen)?;
        let settled = self.settle(&probe).await?;
        self.progress(&format!(
            "{}: key {} on {}, instance {}",
            scenario.name(),
            plan.key,
            chosen.addr(),
            ["A", "B"][door]
        ));
        let mut row = self.run_scenario(plan, rng).await?;
        if settled > SETTLED_NOTE {
            let settled = format!(
                "both instances wrote to the key's master {:.1} s after the scenario began (the previous heal lingering)",
                settled.as_secs_f64()
            );
            row.note = if row.note.is_empty() {
                settled
            } else {
                format!("{settled}; {}", row.note)
            };
        }
        Ok(row)
    }

    /// Waits until both instances apply a publish of `probe` (a key on the scenario's master)
    /// at once, not queued: the previous scenario's heal is over for them too. Returns how long
    /// that took.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] when one does not within [`HEALTHY_WITHIN`].
    async fn settle(&self, probe: &str) -> Result<Duration> {
        let started = Instant::now();
        let mut version = 0;
        for base in &self.bases {
            loop {
                version += 1;
                let url = format!("{base}/v1/keys/{probe}?version={version}");
                let status = match self.http.put(&url).body("probe").send().await {
                    Ok(answer) => answer.status().as_u16(),
                    Err(_) => 0,
                };
                if status == 200 {
                    break;
                }
                if started.elapsed() > HEALTHY_WITHIN {
                    return Err(unavailable(format!(
                        "{base} still answers {status} to a publish of {probe} {} s after the heal",
                        HEALTHY_WITHIN.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(started.elapsed())
    }

    /// Runs the traffic, the nemesis of `plan`, the convergence, and makes the row.
    async fn run_scenario(&self, plan: Plan<'_>, mut rng: StdRng) -> Result<PartitionRow> {
        let recorder = Recorder::new();
        let traffic = Traffic::new(
            self.http.clone(),
            recorder.clone(),
            plan.key.clone(),
            self.bases.clone(),
            self.seed ^ plan.scenario.index(),
        );
        traffic.set_writer(plan.door);
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        traffic.start(&tracker, &stop);
        tokio::time::sleep(WARM_UP).await;
        let nemesis = self.nemesis(&plan, &traffic, &recorder, &mut rng).await;
        // Whatever happened, nothing stays cut and the writers stop at the heal.
        let healed = self.topology.network.heal().map_err(unavailable);
        traffic.stop_writers().await;
        let outcome = match (nemesis, healed) {
            (Ok(nemesis), Ok(())) => Ok(nemesis),
            (Err(err), _) | (_, Err(err)) => Err(err),
        };
        let outcome = match outcome {
            Ok(nemesis) => self.converge(&plan, &traffic, nemesis).await,
            Err(err) => Err(err),
        };
        tokio::time::sleep(READ_ON).await;
        stop.cancel();
        tracker.close();
        tracker.wait().await;
        let nemesis = outcome?;
        let spec = RowSpec {
            scenario: plan.scenario.name(),
            rule: plan.scenario.rule(),
            judged: plan.scenario.judged(),
        };
        let row = figures(&spec, &nemesis, &traffic.published(), &recorder.take());
        self.progress(&format!("{}: done", plan.scenario.name()));
        Ok(row)
    }

    /// Makes `plan`'s cuts and heals (the last heal included) while the traffic runs.
    async fn nemesis(
        &self,
        plan: &Plan<'_>,
        traffic: &Arc<Traffic>,
        recorder: &Recorder,
        rng: &mut StdRng,
    ) -> Result<NemesisRecord> {
        let instance = &self.topology.instances[plan.door];
        let mut record = NemesisRecord::new(plan.key.clone(), recorder.clone());
        match plan.scenario {
            Scenario::InstanceFromMaster => {
                let cut = Partition::cut(instance, plan.master.host());
                self.hold(&cut, self.jittered(rng), &mut record).await?;
            }
            Scenario::MasterFromReplica => {
                let replica = self.replica_of(plan.master)?;
                let cut = Partition::cut(plan.master.host(), replica.host());
                self.repeat(&cut, Rhythm::SHORT_OF_FAILOVER, rng, &mut record)
                    .await?;
            }
            Scenario::SplitBrain(_) => {
                self.split_brain(plan, traffic, rng, &mut record).await?;
            }
            Scenario::InstanceFromRegistry => {
                self.registry_cut(plan, rng, &mut record).await?;
            }
            Scenario::Flapping => {
                let cut = Partition::cut(instance, plan.master.host());
                self.repeat(&cut, Rhythm::FLAPPING, rng, &mut record)
                    .await?;
            }
        }
        Ok(record)
    }

    /// Applies `cut`, holds it for `length`, and heals; the window goes into `record`.
    async fn hold(
        &self,
        cut: &Partition,
        length: Duration,
        record: &mut NemesisRecord,
    ) -> Result<()> {
        let network = &self.topology.network;
        network.apply(cut).map_err(unavailable)?;
        record.cut_from_us = record.clock.now_us();
        record.label = cut.label().to_owned();
        tokio::time::sleep(length).await;
        network.heal().map_err(unavailable)?;
        record.cut_to_us = record.clock.now_us();
        record.cuts = 1;
        Ok(())
    }

    /// Applies `cut` for `on_ms` and heals for `off_ms` (each drawn in its range), again and
    /// again for the base cut length; the window is from the first cut to the last heal.
    async fn repeat(
        &self,
        cut: &Partition,
        rhythm: Rhythm,
        rng: &mut StdRng,
        record: &mut NemesisRecord,
    ) -> Result<()> {
        let network = &self.topology.network;
        let started = Instant::now();
        record.cut_from_us = record.clock.now_us();
        record.label = cut.label().to_owned();
        let Rhythm { on_ms, off_ms } = rhythm;
        while record.cuts == 0 || started.elapsed() < self.cut {
            network.apply(cut).map_err(unavailable)?;
            record.cuts += 1;
            tokio::time::sleep(Duration::from_millis(rng.random_range(on_ms.0..=on_ms.1))).await;
            network.heal().map_err(unavailable)?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(off_ms.0..=off_ms.1))).await;
        }
        record.cut_to_us = record.clock.now_us();
        record.label = format!(
            "{} x{} ({}-{} ms on, {}-{} ms off)",
            cut.label(),
            record.cuts,
            on_ms.0,
            on_ms.1,
            off_ms.0,
            off_ms.1
        );
        Ok(())
    }

    /// The instance of `plan` cut from the registry master for the (jittered) base length; notes
    /// whether the other instance stopped listing it by the end of the cut (after three missed
    /// heartbeats), and how soon after the heal it listed it again.
    async fn registry_cut(
        &self,
        plan: &Plan<'_>,
        rng: &mut StdRng,
        record: &mut NemesisRecord,
    ) -> Result<()> {
        let network = &self.topology.network;
        let cut = Partition::cut(&self.topology.instances[plan.door], plan.registry.host());
        let (this, other) = (&self.bases[plan.door], &self.bases[1 - plan.door]);
        let id = instance_id(&self.http, this).await.unwrap_or_default();
        network.apply(&cut).map_err(unavailable)?;
        record.cut_from_us = record.clock.now_us();
        record.cuts = 1;
        record.label = cut.label().to_owned();
        tokio::time::sleep(self.jittered(rng)).await;
        let listed_at_heal = lists(&self.http, other, &id).await;
        network.heal().map_err(unavailable)?;
        record.cut_to_us = record.clock.now_us();
        let healed = Instant::now();
        let mut relisted = None;
        while healed.elapsed() < RELIST_WITHIN {
            if lists(&self.http, other, &id).await == Some(true) {
                relisted = Some(healed.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let name = ["A", "B"];
        record.note = format!(
            "{} {} listed by {} at the heal; {}",
            name[plan.door],
            match listed_at_heal {
                Some(true) => "still",
                Some(false) => "no longer",
                None => "unknown whether",
            },
            name[1 - plan.door],
            relisted.map_or_else(
                || format!("not listed again within {} s", RELIST_WITHIN.as_secs()),
                |after| format!("listed again {:.1} s after the heal", after.as_secs_f64())
            )
        );
        Ok(())
    }

    /// The split brain: the key's master and A isolated from every other node and instance
    /// (the driver reaches all); A publishes until the majority has promoted the replica; the
    /// version the promoted replica holds then is what survived; once B serves it, the readers
    /// read it alone for 0.3-0.8 s more; B publishes for half the base cut length; the heal.
    async fn split_brain(
        &self,
        plan: &Plan<'_>,
        traffic: &Arc<Traffic>,
        rng: &mut StdRng,
        record: &mut NemesisRecord,
    ) -> Result<()> {
        let topology = self.topology;
        let replica = self.replica_of(plan.master)?;
        let inside = [plan.master.host(), &topology.instances[A]];
        let mut cut = Partition::default();
        for host in topology.network.hosts() {
            if inside.contains(&host) || host == &topology.driver {
                continue;
            }
            for member in inside {
                cut = cut.and(Partition::cut(member, host));
            }
        }
        topology.network.apply(&cut).map_err(unavailable)?;
        record.cut_from_us = record.clock.now_us();
        record.cuts = 1;
        record.label = format!("isolate({}, i1)", plan.master.host().name());
        let cut_at = Instant::now();
        // Asked of the replica itself: the isolated master, first in the list, sees no failover.
        loop {
            let view = tokio::task::block_in_place(|| topology.cluster.topology_from(replica));
            let promoted = view.is_ok_and(|view| {
                view.iter()
                    .any(|info| info.is_myself() && info.is_master() && !info.slots.is_empty())
            });
            if promoted {
                break;
            }
            if cut_at.elapsed() > FAILOVER_WITHIN {
                return Err(unavailable(format!(
                    "the majority did not promote {} within {} s",
                    replica.addr(),
                    FAILOVER_WITHIN.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let failover = cut_at.elapsed();
        traffic.stop_writers().await;
        let copy = format!("{}#0", plan.key);
        let held =
            tokio::task::block_in_place(|| topology.cluster.cli(replica, &["HGET", &copy, "ver"]))
                .map_err(unavailable)?;
        record.survivor = Some((A, held.trim().parse().unwrap_or(0)));
        // Before B publishes, the readers read the set-back copy for a while: whoever was served
        // a version it lacks must be refused, never served the older one. B serves the key again
        // only once it routes to the promoted replica.
        let promoted_at = Instant::now();
        let served_by_b = self.served(&self.bases[B], &plan.key).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..=800))).await;
        let gap = promoted_at.elapsed();
        traffic.set_writer(B);
        tokio::time::sleep(self.jittered(rng) / 2).await;
        topology.network.heal().map_err(unavailable)?;
        record.cut_to_us = record.clock.now_us();
        record.note = format!(
            "failover after {:.1} s; the promoted replica held v{}; B {} and began publishing {:.1} s after the promotion",
            failover.as_secs_f64(),
            record.survivor.map_or(0, |(_, version)| version),
            served_by_b.map_or_else(
                || format!("served no read of the key within {} s", SERVED_WITHIN.as_secs()),
                |after| format!("served it {:.1} s after the promotion", after.as_secs_f64())
            ),
            gap.as_secs_f64()
        );
        Ok(())
    }

    /// Waits until every copy of the key holds the newest acknowledged version (at least), and
    /// records when; `None` when it did not happen within [`CONVERGE_WITHIN`].
    async fn converge(
        &self,
        plan: &Plan<'_>,
        traffic: &Arc<Traffic>,
        mut record: NemesisRecord,
    ) -> Result<NemesisRecord> {
        let target = record.target(&traffic.published());
        let healed = Instant::now();
        let copy = format!("{}#0", plan.key);
        let cluster = &self.topology.cluster;
        loop {
            let held = tokio::task::block_in_place(|| {
                cluster
                    .master_for_key(copy.as_bytes())
                    .and_then(|node| cluster.cli(node, &["HGET", &copy, "ver"]))
            });
            let held: Option<u64> = held.ok().and_then(|text| text.trim().parse().ok());
            if let Some(held) = held.filter(|held| *held >= target) {
                record.converged = Some((held, record.clock.now_us()));
                return Ok(record);
            }
            if healed.elapsed() > CONVERGE_WITHIN {
                record.note = format!(
                    "{} copy {copy} held {held:?} {} s after the heal, below v{target}",
                    record.note,
                    CONVERGE_WITHIN.as_secs()
                );
                return Ok(record);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls a plain read of copy 0 of `key` through `base` until it is served, for at most
    /// [`SERVED_WITHIN`]; returns how long that took.
    async fn served(&self, base: &str, key: &str) -> Option<Duration> {
        let started = Instant::now();
        let url = format!("{base}/v1/keys/{key}?copy=0");
        while started.elapsed() < SERVED_WITHIN {
            let answer = self.http.get(&url).send().await;
            if answer.is_ok_and(|answer| answer.status().is_success()) {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// The base cut length drawn within ±20 %.
    fn jittered(&self, rng: &mut StdRng) -> Duration {
        self.cut.mul_f64(rng.random_range(0.8..1.2))
    }

    /// The first replica of `master`.
    fn replica_of(&self, master: &NetNode) -> Result<&NetNode> {
        tokio::task::block_in_place(|| self.topology.cluster.replicas_of(master))
            .map_err(unavailable)?
            .first()
            .copied()
            .ok_or_else(|| unavailable(format!("{} has no replica", master.addr())))
    }
}

/// How a repeated cut flips: milliseconds cut, then milliseconds healed, each drawn from its
/// inclusive range.
#[derive(Debug, Clone, Copy)]
struct Rhythm {
    /// The range of each cut's length.
    on_ms: (u64, u64),
    /// The range of each heal's length.
    off_ms: (u64, u64),
}

impl Rhythm {
    /// Cuts shorter than `cluster-node-timeout` (2 s), so the replica never starts a failover.
    const SHORT_OF_FAILOVER: Rhythm = Rhythm {
        on_ms: (600, 1200),
        off_ms: (300, 700),
    };

    /// Flapping: a few hundred milliseconds each way.
    const FLAPPING: Rhythm = Rhythm {
        on_ms: (150, 400),
        off_ms: (150, 400),
    };
}

/// What one scenario works on.
struct Plan<'a> {
    /// Which scenario.
    scenario: Scenario,
    /// The one-copy key it publishes and reads.
    key: String,
    /// The key's master.
    master: &'a NetNode,
    /// The master holding the registry records.
    registry: &'a NetNode,
    /// The instance it cuts (and whose writer publishes): [`A`] or [`B`].
    door: usize,
}

/// The first key `<family>s<scenario>-<n>` whose one copy lives on `master`.
fn key_on(
    view: &[NodeInfo],
    cluster: &hotsplit_devcluster::NetCluster,
    family: &str,
    scenario: u64,
    master: &NetNode,
) -> Result<String> {
    (0..4096)
        .map(|n| format!("{family}s{scenario}-{n}"))
        .find(|key| {
            cluster
                .master_for_key_in(view, format!("{key}#0").as_bytes())
                .is_ok_and(|node| node.addr() == master.addr())
        })
        .ok_or_else(|| unavailable(format!("no key of {family} lives on {}", master.addr())))
}

/// An error of the run's machinery (the network, the cluster), as [`ErrorKind::Unavailable`].
pub(super) fn unavailable(err: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, err.to_string())
}
