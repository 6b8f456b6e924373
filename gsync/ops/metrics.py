"""Prometheus metrics: the seed's ``ngit_sync_*`` names (dashboards keep working) plus gsync's own.

Defined once here; the manager refreshes the gauges on its maintenance tick, counters are
incremented where the thing happens.
"""
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

REGISTRY = CollectorRegistry(auto_describe=True)
# process_resident_memory_bytes, process_open_fds, process_max_fds, CPU seconds (from /proc)
ProcessCollector(registry=REGISTRY)

BUILD_INFO = Gauge("gsync_build_info", "Always 1: the running gsync's version and Python",
                   ["version", "python"], registry=REGISTRY)
# What state_dir and the tables hold (SPEC §8: bounded by the work, never by uptime)
RELAYS_HELD = Gauge("gsync_relays_held", "Relays in the manager's tables (relays with work)",
                    registry=REGISTRY)
THREAD_MEMBERS = Gauge("gsync_thread_members",
                       "Thread members watched for descendants, summed over relays (SPEC §3; "
                       "most of the memory that grows with the work)", registry=REGISTRY)
REJECTED_BYTES = Gauge("gsync_rejected_bytes", "Bytes the rejected index's entries stand for",
                       registry=REGISTRY)
STATE_SAVE_AGE = Gauge("gsync_state_save_age_seconds",
                       "Seconds since state_dir was last written; grows while saves fail "
                       "(-1: not yet)", registry=REGISTRY)

# -- the seed's names (SPEC §7) ----------------------------------------------------------
RELAY_CONNECTED = Gauge(
    "ngit_sync_relay_connected",
    "Connection status: 0 Disconnected, 1 Connecting, 2 Syncing, 3 Connected, "
    "4 ConnectedHistoricSyncFailures",
    ["relay"],
    registry=REGISTRY,
)
CONNECTION_ATTEMPTS = Counter(
    "ngit_sync_connection_attempts_total",
    "Connection attempts by relay and result",
    ["relay", "result"],
    registry=REGISTRY,
)
RELAY_STATUS = Gauge(
    "ngit_sync_relay_status",
    "Health: 1 healthy, 2 disconnected, 3 degraded, 4 dead, 5 rate_limited",
    ["relay"],
    registry=REGISTRY,
)
RELAY_FAILURES = Gauge(
    "ngit_sync_relay_failures", "Consecutive failures per relay", ["relay"], registry=REGISTRY
)
EVENTS_SYNCED = Counter(
    "ngit_sync_events_synced_total",
    "Events newly saved by the own relay (not duplicates, not rejected)",
    registry=REGISTRY,
)
RELAYS_TRACKED = Gauge(
    "ngit_sync_relays_tracked_total", "Relays discovered and tracked", registry=REGISTRY
)
RELAYS_CONNECTED = Gauge(
    "ngit_sync_relays_connected_total", "Relays currently connected", registry=REGISTRY
)
RELAYS_DEAD = Gauge("ngit_sync_relays_dead_total", "Relays marked dead", registry=REGISTRY)

# -- gsync's own ---------------------------------------------------------------------------
DROPS = Counter(
    "gsync_events_dropped_total", "Remote frames or events dropped, by reason", ["reason"],
    registry=REGISTRY,
)
DELIVERIES = Counter(
    "gsync_deliveries_total",
    "Own-relay answers to deliveries by outcome (delivered, duplicate, purgatory, rejected, "
    "retry_rate_limited, retry_error, retry_timeout, retry_disconnect, retry_auth)",
    ["outcome"],
    registry=REGISTRY,
)
DELIVERIES_GIVEN_UP = Counter(
    "gsync_deliveries_given_up_total",
    "Deliveries refused without a final word (error:, another prefix, none) as many times as "
    "they are tried (constants.DELIVERY_MAX_ATTEMPTS), then kept as refused, by the prefix "
    "of the last refusal",
    ["reason"],
    registry=REGISTRY,
)
EVENTS_RECEIVED = Counter(
    "gsync_remote_events_total", "Checked events received from remote relays", ["relay"],
    registry=REGISTRY,
)
BYTES_UP = Counter("gsync_bytes_sent_total", "Websocket bytes sent", ["relay"], registry=REGISTRY)
BYTES_DOWN = Counter(
    "gsync_bytes_received_total", "Websocket bytes received", ["relay"], registry=REGISTRY
)
NEGENTROPY_BYTES = Counter(
    "gsync_negentropy_bytes_total", "NIP-77 message bytes", ["relay", "direction"],
    registry=REGISTRY,
)
NEGENTROPY_ROUNDS = Counter(
    "gsync_negentropy_rounds_total", "NIP-77 rounds", ["relay"], registry=REGISTRY
)
SUBSCRIPTIONS = Gauge(
    "gsync_subscriptions", "Open subscriptions per relay", ["relay"], registry=REGISTRY
)
QUEUE_DEPTH = Gauge("gsync_queue_depth", "Queue depths", ["queue"], registry=REGISTRY)
QUEUE_DEPTH_PEAK = Gauge(
    "gsync_queue_depth_peak", "Highest queue depth since start", ["queue"], registry=REGISTRY
)
HANDSHAKES_IN_FLIGHT = Gauge(
    "gsync_handshakes_in_flight", "Handshake workers busy", registry=REGISTRY
)
BACKGROUND_STARTS = Counter(
    "gsync_background_starts_total",
    "Paced starts spent on a remote, by method (req: historic REQs and their pages; "
    "negentropy: NIP-77 exchanges) and purpose (sync: layers 1-3; recovery; other: "
    "descendants, polled live coverage, catch-ups)",
    ["relay", "method", "purpose"], registry=REGISTRY,
)
REFUSALS = Counter(
    "gsync_relay_refusals_total", "Refusals from remote relays by category", ["category"],
    registry=REGISTRY,
)
HANGUPS = Counter(
    "gsync_relay_hangups_total",
    "Relay sessions gsync ended because the relay misbehaved, by reason (junk, misbehaving, "
    "stalled_message, bad_frame)",
    ["reason"],
    registry=REGISTRY,
)
NOTICES = Counter(
    "gsync_relay_notices_total", "NOTICE messages from remote relays, by prefix", ["prefix"],
    registry=REGISTRY,
)
OWN_RELAY_LOSSES = Counter(
    "gsync_own_relay_losses_total",
    "Times the own relay was found without events it had stored (back from an outage, or at start)",
    registry=REGISTRY,
)
OWN_RELAY_READS = Counter(
    "gsync_own_relay_reads_total",
    "REQs gsync sent the own relay to read what it holds (pages of NIP-77 have-sets)",
    registry=REGISTRY,
)
OWN_RELAY_READ_BYTES = Counter(
    "gsync_own_relay_read_bytes_total",
    "Bytes of the own relay's answers to those reads",
    registry=REGISTRY,
)
OWN_HOLDINGS = Counter(
    "gsync_own_holdings_total",
    "Filters whose own-relay holdings a historic batch needed, by source: read (asked the "
    "own relay) or known (read earlier this session, kept with what the own relay "
    "accepted since)",
    ["source"],
    registry=REGISTRY,
)
EVENTS_UNRECOVERED = Counter(
    "gsync_events_unrecovered_total",
    "Ids a remote advertised and never served, dropped from missing-event recovery after "
    "12 attempts in a row that recovered nothing (log recovery_gave_up)",
    registry=REGISTRY,
)
EVENTS_UNSERVABLE = Counter(
    "gsync_events_unservable_total",
    "Ids a remote advertised through NIP-77 and served neither by id nor by the filter that "
    "found them (hidden, expired or deleted there): not asked there again before its next "
    "daily fresh start, recovered from the other relays listing their repository "
    "(log events_unservable)",
    ["relay"],
    registry=REGISTRY,
)
LIVE_EVENTS_MISSED = Counter(
    "gsync_live_events_missed_total",
    "Events an hourly look at what a remote's open live subscriptions asked for brought that "
    "gsync never had, dated while they were open: the remote dropped the subscriptions "
    "without a word, and they were opened anew (log live_events_missed)",
    ["relay"],
    registry=REGISTRY,
)
CROWDED_SECONDS = Counter(
    "gsync_crowded_seconds_total",
    "Seconds in which a remote held more events of a filter than it serves in a page, by "
    "how gsync completed them: negentropy (NIP-77 over that second), split (the filter "
    "split by tag values, kinds or authors), incomplete (nothing splits it: events of that "
    "second may be missing)",
    ["outcome"],
    registry=REGISTRY,
)
NEGENTROPY_FAILURES = Counter(
    "gsync_negentropy_failures_total",
    "NIP-77 exchanges a remote did not complete, by reason (neg-err, unsupported-version, "
    "notice, bad-message, timeout, too-many-ids, too-many-results)",
    ["reason"],
    registry=REGISTRY,
)
PAUSED_COVERAGE = Gauge(
    "gsync_paused_coverage",
    "Filter shapes a relay refused by policy, not asked again until their 24 h probe",
    ["relay"],
    registry=REGISTRY,
)

# -- for alerts: states and their bounds, set on the manager's metrics refresh --------------
READY = Gauge(
    "gsync_ready",
    "1 once the self-subscription has read the own relay's history (systemd READY=1)",
    registry=REGISTRY,
)
OWN_RELAY_UP = Gauge(
    "gsync_own_relay_up",
    "1 while the own relay is reachable: the self-subscription is connected and delivery "
    "has a connection",
    registry=REGISTRY,
)
REPOSITORIES = Gauge(
    "gsync_repositories", "Repositories the own relay accepted, which gsync syncs",
    registry=REGISTRY,
)
DELIVERY_BACKLOG_LIMIT = Gauge(
    "gsync_delivery_backlog_limit",
    "[sync] delivery_max_backlog: relay connections stop reading when the delivery backlog "
    "(gsync_queue_depth{queue=\"delivery\"}) reaches it",
    registry=REGISTRY,
)
REJECTED_ENTRIES = Gauge(
    "gsync_rejected_index_entries",
    "Event ids the own relay refused, not fetched again for 7 days",
    registry=REGISTRY,
)
REJECTED_LIMIT = Gauge(
    "gsync_rejected_index_limit",
    "The most ids the rejected index keeps: past it the oldest are forgotten (and fetched again)",
    registry=REGISTRY,
)

BACKGROUND_START_INTERVAL = Gauge(
    "gsync_background_start_interval_seconds",
    "[sync] background_start_interval_ms: the pacing gate, at most one background start per "
    "relay this often (0: off)",
    registry=REGISTRY,
)


RELAY_PARKED = Gauge(
    "gsync_relay_parked_seconds",
    "Seconds until a relay that failed permanently (name not resolving, TLS, an HTTP answer "
    "that is no websocket upgrade) is dialled again; 0 when it is not parked",
    ["relay"],
    registry=REGISTRY,
)


PER_RELAY_GAUGES = (RELAY_CONNECTED, RELAY_STATUS, RELAY_FAILURES, SUBSCRIPTIONS, PAUSED_COVERAGE,
                    RELAY_PARKED)


def relay_labelled() -> list:
    """Every metric of REGISTRY with a ``relay`` label."""
    return [m for m in globals().values()
            if isinstance(m, (Counter, Gauge)) and "relay" in getattr(m, "_labelnames", ())]


def forget_relay(relay: str) -> None:
    """A retired relay's series go, every one (gauges, and counters too: relay URLs come
    from whoever publishes announcements, so a series per URL ever seen would grow with
    uptime, SPEC §8)."""
    for metric in relay_labelled():
        names = metric._labelnames
        keys = {tuple(sample.labels[n] for n in names)
                for family in metric.collect() for sample in family.samples
                if sample.labels.get("relay") == relay}
        for key in keys:
            try:
                metric.remove(*key)
            except KeyError:
                pass


# -- progress of the first sync and each daily fresh start (sync.progress) --------------------
SYNC_REPOS_COMPLETE = Gauge(
    "gsync_sync_repositories_complete",
    "Repositories whose history every reachable relay listing them has given (of "
    "gsync_repositories): falls back at a relay's daily fresh start until it has again",
    registry=REGISTRY,
)
SYNC_RELAYS_SYNCED = Gauge(
    "gsync_sync_relays_synced",
    "Relays whose historic sync is done (ngit_sync_relay_connected 3 or 4), of "
    "ngit_sync_relays_tracked_total",
    registry=REGISTRY,
)
SYNC_SECONDS_LEFT = Gauge(
    "gsync_sync_seconds_left",
    "Estimated seconds until every syncing relay's historic sync is done: the slowest "
    "relay's queued starts and expected pages times its gate interval (0: nothing syncing; "
    "-1: unknown, the pacing gate is off)",
    registry=REGISTRY,
)
STARTS_QUEUED = Gauge(
    "gsync_starts_queued",
    "Historic REQs, pages and NIP-77 exchanges waiting for the relay's pacing gate",
    ["relay"],
    registry=REGISTRY,
)
