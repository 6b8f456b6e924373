"""Every number of the sync design in one place, each with the reason it has that value.

Sources: SPEC.md (§ given) and the GRASP-02 design (seeds/001). Configurable values are the
defaults of the INI keys named beside them; the code reads the config object, not these.
"""

# -- own relay (SPEC §2) -----------------------------------------------------------------
SELF_SUB_KINDS = (30617, 1617, 1618, 1621)  # announcements and roots; NOT 30618 / 1619
# What the self-subscription's rereads (every SELF_REREAD_SECS) also read of a single
# instance's own relay: the kinds thread members published to it directly are (NIP-22
# comments, NIP-10 replies), so that replies tagging only them are asked of the remotes
# within minutes, not after the next read of their thread, a day later (``SelfSubscriber``;
# with shards, everything the own relay stores is shown live)
MEMBER_KINDS = (1111, 1)
RECONNECT_OVERLAP_SECS = 900  # since = last_connected - 900: clocks and relay lag drift
# The self-subscription's history is read again this often (since the last read, less the
# overlap): a relay may drop live events for a subscriber that reads too slowly.
SELF_REREAD_SECS = 300
# Once a day that re-read goes back to the beginning: a root published with a created_at
# older than the overlap (backdated, or while gsync was away) and not shown live is found.
SELF_FULL_REREAD_SECS = 24 * 3600
# The self-subscription's live read: after this long with nothing from the own relay it
# pings; nothing again for as long (not even the pong) and the socket is half-open: the
# session ends and a new one reads since the last one (found within 50 s, SPEC §8).
OWN_IDLE_PING_SECS = 25.0
# The self-subscription's live read takes what the own relay sent in gulps: after a read that
# left nothing waiting, it pauses this long, so that the next read takes every event stored
# meanwhile instead of one socket read, one wake-up and one message to the manager per event.
# With shards the stream carries every event the own relay stores (the landed stream): read
# event by event it cost each shard more CPU than all it parsed; bench/scale N = 50, 20,000
# events, gate off, two shards: 1.68x one instance's gsync CPU read so, 1.12-1.16x in gulps.
# What the own relay stores is known that much later (the pause, no more: a read that fills
# a chunk is followed by the next at once, so a fast own relay is never left waiting).
OWN_STREAM_GULP_SECS = 0.1
# A self-subscription session that lasted this long was a recovery: the next reconnect comes
# at once (0.5 s); a shorter one backs off, doubling to 10 s (``SelfSubscriber._run``).
OWN_SESSION_STABLE_SECS = 30.0
# A read of the own relay's history (the first, or a re-read) ends by this deadline
# whatever the relay sends (a relay dribbling events never reaches the per-read timeout);
# the first read then starts a new session, a re-read is tried at the next round. LocalRelay
# pages 100,000 events in well under a minute on loopback.
OWN_HISTORY_DEADLINE_SECS = 600.0
# An own relay that does not answer our AUTH (nostr_relay sends no OK to it) is taken to
# have taken it this long after it went: delivery's EVENTs refused auth-required within it
# were most likely read before it did; a read refused for want of AUTH is asked again then.
AUTH_SETTLE_SECS = 1.0
BATCH_WINDOW_MS = 5_000  # [sync] batch_window_ms: lets a burst of discoveries share REQs
# StateOnly repos live 24 h after the own relay last answered ``purgatory:`` about them (to
# their announcement, or to one of their state events: what restarts a GRASP relay's own
# purgatory clock), like the relay's 24 h revival window.
PURGATORY_TTL_SECS = 24 * 3600

# -- filters and budgets (SPEC §3) -------------------------------------------------------
LAYER1_KINDS = (30617, 10317)
STATE_KIND = 30618
ROOT_KINDS = (1617, 1618, 1621)
MAX_TAG_VALUE_BYTES_PER_FILTER = 32 * 1024  # about 489 hex ids: fits common relay frame caps
MAX_FILTERS_PER_REQ = 10  # OR-ed filters share one REQ, bounding relay-visible subscriptions
DEFAULT_MAX_SUBSCRIPTIONS = 20  # with no NIP-11: the most common relay default
CONTROL_PLANE_SLOTS = 2  # layer 1 live + one
TRANSIENT_HISTORIC_SLOTS = 1
CONSOLIDATION_EXCESS = 70  # subscriptions above the live baseline before consolidating
# A consolidation closes every live REQ of a relay, opens them again packed and fetches the
# gap since now less 15 minutes, for all of that coverage. When the budget is full it is done
# only if packing anew makes room (the new coverage included), and at most this often per
# relay: new roots coming every few seconds to a relay whose budget is full had it consolidate
# every 20 s, each time fetching the last 15 minutes again (the 30-minute soak: 483 of them).
# Between two, coverage that does not fit is polled, fresh (``LiveCoverage.open_groups``).
CONSOLIDATION_MIN_SECS = 60.0
# Serialized filter JSON we keep open on one connection. Relays bound it (LocalRelay refuses
# past 1 MiB: "active subscriptions exceed max size"); NIP-11 has no field for it. Live
# coverage gets 512 KiB, historic work the rest; what live cannot hold is polled instead.
MAX_OPEN_FILTER_BYTES = 768 * 1024
MAX_LIVE_FILTER_BYTES = 512 * 1024
# Live coverage that did not fit is asked for again this long after its last poll started,
# at the soonest, for every REQ the poll takes (each is a subscription, and one of the
# relay's paced starts: a poll of four filters that go alone every 5 s took four of every
# five starts for the rest of a session, seed 515's year).
POLL_SECS = 5.0
# Every poll sends all of its filters again: 4,000 roots' e/E/q coverage past the live budget
# is about 300 kB, which every 5 s was 3.7 MB a minute (and 23 paced starts) to a relay that
# had nothing new (bench/historic --idle). So polls are spaced by what they send too: a second
# for every KiB of their filters (at most about 1 kB/s a relay), up to POLL_MAX_SECS apart.
# Nothing is missed by spacing them: each asks since the last successful poll, less the
# 15-minute overlap.
POLL_SECS_PER_KIB = 1.0
POLL_MAX_SECS = 600.0
# Coverage that came within this long (new repositories, roots and thread members, where new
# events are likely) is polled apart from the rest, on the cadence its own size allows: a
# few new roots past a full budget are asked for every few seconds, not every ten minutes.
FRESH_POLL_SECS = 3600.0
# A relay whose live coverage is polled is looked at this often: if its live subscriptions
# packed anew take fewer REQs than are open (they fragmented as coverage came a little at a
# time), one consolidation brings polled coverage live. Seed 4's year: a relay allowing 10
# subscriptions, 7 live ones open, its new coverage polled every 5 s for hours (busy_loop).
POLLED_CONSOLIDATION_CHECK_SECS = 600.0
# A live REQ the relay closed for no stated reason (not rate, policy or size) is opened again
# from the current index; closed again within this long of that, it is polled instead: a
# relay that closes every live REQ at once must not get a REQ/CLOSED loop.
LIVE_REBUILD_MIN_SECS = 60.0
# A relay that keeps no live REQ (closed again within LIVE_REBUILD_MIN_SECS of its rebuild:
# one that closes every subscription after its EOSE) has all its live coverage polled: no
# oftener than this, and not brought live again this session. The poll cadence alone (a
# second a KiB, 5 s a REQ) asked such a relay three REQs every 16 s for good (the
# simulator, every relay closing after EOSE: 11,700 messages an hour for six relays). A
# relay that wants no subscription held is asked every 5 minutes, not kept busier than a
# live one: what only it gets waits that long (the daily sync, and the other relays a
# repository lists, bring the rest).
LIVE_NOT_KEPT_POLL_SECS = 300.0
# Live subscriptions a relay drops without a word (ORLY drops every one carrying a ``limit`` it
# has reached, ``limit: 0`` included; relays and proxies expire idle ones) deliver nothing,
# and what only that relay gets waited for the daily sync. Once an hour after its historic
# sync, what a relay's open live subscriptions asked for since the last look is asked again
# (one paced REQ, ``LiveCoverage.run_audits``): an event it brings that gsync never had, dated
# while those subscriptions were open (and LIVE_AUDIT_MARGIN_SECS before the look: one in
# flight is not missed), was missed: it is delivered, and the live subscriptions are opened
# anew (one a relay or a proxy expired is back; one that drops them again has what only it
# gets come by the next look, an hour at most). The relays' looks come together: one due
# brings forward every look due within half an interval (``run_audits``).
LIVE_AUDIT_SECS = 3600.0
# A relay whose look found events its live subscriptions missed is known to drop them for this
# long after (``RelayState.live_dropped_at``): its live REQs go with ``since`` (below), its
# looks one filter a REQ while it is not proven to answer several
# (``one_filter.looks_filter_by_filter``). A month: a look packed on a
# relay answering one filter of a REQ sees misses of that filter only, so a relay that drops
# live subscriptions and answers one filter a REQ is seen dropping them seldom.
LIVE_DROPS_REMEMBERED_SECS = 30 * 24 * 3600.0
# A relay found refusing filters that may bring notes without naming authors (AntiSyncBots:
# ``RelayState.precise_refused``) is asked them again at its first daily sync this long after
# (its policy may have changed; still so, it costs a refusal per shape, a kinds probe and its
# check, once a month)
NOTES_REFUSAL_REMEMBERED_SECS = 30 * 24 * 3600.0
# ... and its live REQs go without ``limit: 0``, asking stored events from this long back
# instead (``filter_plan.live_since``): ORLY keeps a filter without a ``limit`` live. Events
# dated a little before the REQ and published after it (a client's clock, a slow publish)
# still match; those stored in the margin come again with each REQ (known ones are skipped).
LIVE_SINCE_MARGIN_SECS = 300
LIVE_AUDIT_MARGIN_SECS = 5
POLL_OVERLAP_SECS = 15 * 60
# While a relay's historic sync runs, its batches fetch the polled filters' history up to
# their own start anyway: a poll then only repeats them and takes their paced starts. Polls
# wait for the sync to finish, but never longer than this after the last one (or after the
# coverage was first polled); the cursor still reaches back to then, so nothing is missed.
POLL_DEFER_SECS = 60.0

# -- historic sync (SPEC §4) -------------------------------------------------------------
# A REQ's answer may be cut short: per filter (LocalRelay, strfry: 500), per REQ (all filters
# together), below the 75 the design once assumed, or by a query time budget; NIP-11 rarely
# says which. gsync learns the caps from the pages each connection serves (pending.PageCap)
# and confirms a page with the next one only where a cap may have cut it. A relay that stops
# slow queries cuts anywhere, but only a slow answer: one from REQ to EOSE in more than this
# (relays' query budgets are seconds; loopback pages take milliseconds) is confirmed too.
TIME_CUT_SUSPECT_SECS = 2.0
# The one cap gsync assumes without seeing it: no relay serves a page of fewer than this many
# events (per filter or per REQ) while holding more. It spares the confirming page (and the
# empty one that would step past the boundary second) to the many filters of a few events.
MIN_PAGE_CAP = 10
# The ``limit`` of every historic page (``filter_plan.with_page_limit``): NIP-01's "the last
# n events, newest first" is promised to a filter with a limit only, and paging by ``until``
# needs it. Above every cap seen (strfry and LocalRelay serve 500 a filter whatever is
# asked; relays clamp a larger limit, NIP-11 ``max_limit``) so that a relay without a cap
# still serves a big filter in few pages.
PAGE_LIMIT = 5000
MAX_IDS_PER_REQ = 300
NEGENTROPY_DEADLINE_SECS = 15.0  # total wall clock for one NIP-77 exchange
# The manager's own deadline on an exchange, whatever becomes of its greenlet (one that
# hangs past its own deadline, say in the own relay's holdings read): this long after it
# took its turn (the semaphore of MAX_RUNNING_EXCHANGES), or NEGENTROPY_QUEUE_SECS after it
# was started if it never got one. It then fails as an exchange with no answer does.
NEGENTROPY_GRACE_SECS = 60.0
NEGENTROPY_QUEUE_SECS = 600.0
# A historic REQ (a page, an id fetch) with no sign of life (neither its EOSE nor an event)
# for this long has stalled. Relays answer a page in well under a second (LocalRelay at
# 20,000 events: 40-200 ms), slow public ones in a few seconds; past 30 s of silence the
# relay is not slow but never going to finish, and its batch, its slot and its subscription
# must not wait for ever. Events keep a REQ alive, so a slow page still streaming is never
# cut; while delivery holds our reading back, nothing stalls (the silence is ours).
REQ_STALL_SECS = 30.0
# ... and however alive, a historic REQ (a page) ends this long after it was sent: a relay
# dribbling one event every 25 s never stalls, and would hold its slot and batch for good.
# A page is at most a few hundred events; relays serve one in seconds. It then goes as a
# stall does (split, or its batch fails into missing-event recovery). Time delivery holds
# our reading back does not count.
REQ_LIFETIME_SECS = 300.0
# NIP-77 exchanges running at once over all relays: each holds its filter's have-set (layer
# 1: every announcement the own relay holds, a few MB at 10,000), so memory stays bounded
# however many relays sync at once; queued ones start as others end.
MAX_RUNNING_EXCHANGES = 16
# Own-relay holdings reads (before a batch's methods are chosen): a batch reads this many of
# its filters side by side, and all batches together at most OWN_READS_AT_ONCE_TOTAL.
OWN_READS_PER_BATCH = 4
OWN_READS_AT_ONCE_TOTAL = 32
# ... and a batch's reads end by this deadline, whatever the own relay sends (one dribbling
# events never reaches the per-read timeout): the batch then goes by REQ pages, as when the
# own relay cannot be read. Loopback reads of a filter take milliseconds to a few seconds.
OWN_READ_DEADLINE_SECS = 120.0
# What batches lack of the own relay is read together (``sync.own_reads``): the unread parts
# of every batch asking within this window (and while a read is under way) make one read
# per tag. On an own relay whose tag queries scan, a read costs the same for one value as
# for hundreds: the number of reads is its cost. The window is the batches that ask in the
# same turn of the manager (0 s): a read is worth a start, 10 KB, and on a first sync every
# batch's first start waited out the window, half a second worth 40 KB (``sync.method``);
# what asks while a read is under way still joins the next one.
OWN_READ_WINDOW_SECS = 0.0
# An own-relay holdings read is shared by exchanges over the same filter for this long.
SHARED_HOLDINGS_SECS = 5.0
# What the own relay holds is read once per filter and session, then kept with what it
# accepts (``sync.own_held``): read again after a day (the daily fresh start), after an
# own-relay outage, and when more than OWN_HELD_MAX_EVENTS are known (about 300 bytes
# each: the bound keeps it near 60 MB; past it everything is read again as needed).
OWN_HELD_TTL_SECS = 24 * 3600.0
OWN_HELD_MAX_EVENTS = 200_000
# Reads of the own relay give way to deliveries: while the oldest event delivery sent it has
# waited longer than OWN_BUSY_OK_WAIT_SECS for its OK, a read waits (in steps of
# OWN_READ_DEFER_STEP_SECS), OWN_READ_MAX_DEFER_SECS at most, so that a relay that is slow
# for good still gets read.
OWN_BUSY_OK_WAIT_SECS = 1.0
OWN_READ_DEFER_STEP_SECS = 0.1
OWN_READ_MAX_DEFER_SECS = 10.0
# A relay that advertised ids through NIP-77 and served (nearly) none of them by id gets
# REQ+EOSE for this long before NIP-77 is tried there again (it may have been fixed).
IDS_UNSERVED_RETRY_SECS = 24 * 3600.0
RESIDUAL_FALLBACK_MAX_FRACTION = 0.10
# Without the filter's word, only this many ids advertised and (nearly) none served by id say
# that a relay does not serve ids (seed 001: "at least 20 IDs were advertised"); fewer are
# judged by the filter that found them (``sync.unservable``).
IDS_NOT_SERVED_MIN_ADVERTISED = 20
# Ids a relay advertised and served neither by id nor by their filter, remembered per relay
# until its next daily fresh start, this many at most (the oldest forgotten first: forgetting
# one costs one more ask of it).
UNSERVABLE_MAX_IDS = 10_000
# A refused NIP-77 filter (a result cap, ``sync.result_caps``) goes by REQ pages whole when
# the own relay holds at most this fraction of what the relay holds besides: the pages bring
# little again, where windows of exchanges would each cost a start.
FETCH_BY_FILTER_MAX_HELD_FRACTION = 0.10
# Which method a batch's filters get (NIP-77, REQ pages, an id fetch, waiting for another
# relay's lead) is priced in ``sync.method``: starts, bytes down and own-relay reads, at the
# exchange rate measured there (README, Design). A follower waits at most as long as its wait
# is worth, and never more than FOLLOWER_WAIT_MAX_SECS (a slow or stalled leader).
FOLLOWER_WAIT_MAX_SECS = 10.0
# The model's two prices of a start, measured: bench/start_worth (LocalRelay on LMDB, 3,000
# comments, five runs at load 6-13): 0.37-1.4 ms of the remote's CPU for an empty REQ or
# NEG-OPEN, 37-49 us per KB served, so a start costs a remote what 7.8-30 KB of events do
# (median 9.6 KB, 14 events). And on a first sync, the gate interval an operator waits for
# it: bench/method, the demo's world by REQ pages under the default gate, took in 192 KB in
# 2.1-2.5 s, 80 KB a second.
START_BYTES = 10_000
WAIT_BYTES_PER_SEC = 80_000
# A batch waiting for another shard's lead (``sync.shard``) sees what the other shards
# store, live (``OwnLanded``): past FOLLOWER_WAIT_MAX_SECS it waits on while they stored
# something within OTHER_SHARD_QUIET_SECS (their delivery backlogs drain at the own relay's
# pace: the leader's events come late, not never), OTHER_SHARD_WAIT_MAX_SECS in all.
OTHER_SHARD_QUIET_SECS = 5.0
OTHER_SHARD_WAIT_MAX_SECS = 60.0
# What another shard leads, found within this many seconds of a relay's batch beginning to
# wait for another shard, joins that batch (``HistoricSync.join_other_shard_wait``): one
# wait and one exchange per filter shape for the batch windows of half the longest wait.
OTHER_SHARD_JOIN_SECS = 30.0
QUICK_RECONNECT_SECS = 15 * 60
# Events a layer-2 exchange found missing join the batch's thread exchanges not started yet
# (``sync.threads_ahead``): a root among them stored within this many seconds needs no round
# of its own; at most this many such ids per relay session (most are not roots).
THREADS_AHEAD_SECS = 600.0
THREADS_AHEAD_MAX = 2_000
DAILY_MIN_SECS = 23 * 3600
DAILY_MAX_SECS = 25 * 3600
# After a restart, a relay that confirmed repositories the own relay no longer shows starts
# fresh, its layer 1 bringing their announcements (``lifecycle.look_for_lost``): dialled for
# that for a day at most if nothing else wants it (down or dead meanwhile: as any dial).
LOST_LOOK_SECS = 24 * 3600
# ... and once its layer 1 is done, for this long more: the announcements it brought reach
# the own relay and list it again, and it is not retired in between (its saved pauses with it:
# seed 213 of --fault-scale 2, a refused #q asked again minutes after such a retirement).
LOST_SETTLE_SECS = 600.0
# The own relay, back from an outage, failed to say whether it still holds what it stored
# (``sync.own_witness``): asked again this much later.
OWN_WITNESS_RETRY_SECS = 60.0

# -- missing-event recovery (SPEC §4) ----------------------------------------------------
RECOVERY_BASE_SECS = 30.0
RECOVERY_MAX_SECS = 15 * 60.0
RECOVERY_MAX_ZERO_PROGRESS = 12

# -- health and pacing (SPEC §5) ---------------------------------------------------------
BASE_BACKOFF_SECS = 5.0  # [sync] base_backoff_secs
MAX_BACKOFF_SECS = 3600.0  # [sync] max_backoff_secs
DEAD_AFTER_SECS = 24 * 3600
DEAD_RETRY_SECS = 24 * 3600
# A relay that failed in a way no retry in seconds fixes (its name does not resolve, TLS
# fails, its HTTP server answers the upgrade with 404/403/502) is not dialled again for this
# long (ngit-grasp keeps such relays 12 h on a list): the usual 5 s doubling backoff spent
# dozens of attempts and log lines a day on each.
PERMANENT_FAILURE_PARK_SECS = 12 * 3600
# A relay retired (no repository lists it) keeps what holds its next dial back (its failure
# streak and dead clock, a cooldown, a park) for DEAD_RETRY_SECS after (``health.retire``),
# so one dropped and listed again is not dialled anew as if it had never failed; at most
# this many relays' records, the oldest retirement going first (a few hundred bytes each).
RETIRED_HEALTH_MAX = 1000
STABILITY_SECS = 5 * 60
# A session that ends before it is stable continues the failure streak (SPEC §5), but one that
# served (an EOSE or an event) for at least this long proves the relay works: the streak
# starts again from one, its next dial waits the base backoff. One that lasted this long, and
# as long as gsync waited before dialling it, without serving does not make the streak grow.
# A relay that restarts every few minutes is redialled seconds after it is back, not after an
# hour (seed 001: "a short-lived successful handshake does not reset exponential backoff";
# a minute of service is not a short-lived handshake).
PROVEN_SESSION_SECS = 60.0
RATE_LIMIT_COOLDOWN_SECS = 65.0  # 60 s typical relay window + 5 s margin
# A relay still limiting us at the first request after a cooldown: the next one doubles,
# up to this, until a request is served (a limit of minutes, not one window).
RATE_LIMIT_COOLDOWN_MAX_SECS = 600.0
REACTIVE_GATE_START_SECS = 0.6
REACTIVE_GATE_MAX_SECS = 10.0
# A relay's query pace learnt from its refusals (the reactive gate's gap) spaces the
# background starts of its later sessions too, until this long has passed without a
# query-rate refusal: each session (and each daily fresh start) would otherwise burst at the
# proactive gate into the same limit, lose NIP-77 to it, and learn the pace again
QUERY_PACE_KEEP_SECS = 7 * 24 * 3600.0
PROACTIVE_GATE_SECS = 1.0
POLICY_PROBE_SECS = 24 * 3600
# A probe the relay left unanswered (its REQ stalled: a relay answering slowly, or dropping
# it) tells nothing: asked again this much later, not a day (the simulator's seed 2125 of the
# stress world, a relay taking 40 s to answer left #e paused a day more, and a reply only it
# held came 19 h late)
POLICY_PROBE_UNANSWERED_SECS = 3600
# A relay that lists 77 in supported_nips and then refuses NEG-OPEN or never answers it
# (nos.lol, nostr.wine, nostr.mom), or any relay on which an exchange went wholly unanswered,
# is asked by REQ+EOSE only, over reconnects and restarts, for this long after its last
# failure (SPEC §4: at most once a day): each new session's attempt cost up to the 15 s wait.
NIP77_RETRY_SECS = 24 * 3600
# A subscription cap learnt from refusals (``RelayState.max_subscriptions_learned``) is judged
# again at the first daily sync a week after it was learnt: one the relay raised since (an
# upgrade), or learnt low from what could not be read exactly (strfry's "too many concurrent
# REQs" NOTICE names no subscription: a burst's refusals are guesses), is not kept for good.
# Judging it again costs a capped relay one refusal a week. (Reverted once, 176a765, when
# seed 703 of bench/README's per-filter world relearnt 8 where the relay holds 10; kept since
# gsync no longer opens past the cap it holds nor learns from a second guess of one burst.)
LEARNT_CAP_SECS = 7 * 24 * 3600
MAINTENANCE_TICK_SECS = 2.0
DESCENDANT_TICK_SECS = 5.0
HANDSHAKE_WORKERS = 8  # [sync] handshake_workers
# A relay's answer to the websocket upgrade is read at most this far: a 101 is a few hundred
# bytes and a refusal page a few KB, while websocket-client would read a refusal's whole
# body (any Content-Length) into memory, copying it at every 16 KB.
MAX_HANDSHAKE_ANSWER_BYTES = 64 * 1024
# DNS, TCP/TLS, the websocket upgrade and NIP-11 of one attempt, in total: a relay that
# accepts and never answers holds one of the eight workers no longer than this.
HANDSHAKE_TIMEOUT_SECS = 15.0

# -- rejected index (SPEC §5) ------------------------------------------------------------
REJECTED_HOT_SECS = 120
REJECTED_COLD_SECS = 7 * 24 * 3600
# Events the own relay refused with everything else wait for it to store anew; when nothing
# is stored anew for this long after the first waited (a quiet world: nothing new came to
# show that a relay put read-only is writable again), one of them is offered again, then at
# doubling gaps to the longest (``sync.rejected.RejectedIndex.take_store_probe``).
STORE_PROBE_FIRST_SECS = 600
STORE_PROBE_MAX_SECS = 2 * 3600
# Released by the own relay storing again with their repository's announcement or their root,
# events wait for it to be accepted, this long at most (``sync.rejected.RejectedIndex._behind_others``).
RELEASE_BEHIND_OTHERS_SECS = 600
# An event of a repository gsync follows, refused: the own relay may have lost the
# repository's announcement (one in memory restarted empty), and no relay may hold the one
# followed any more. It goes to the own relay again from memory, at once, then no sooner than
# these gaps, doubling while such refusals come (``OwnRelayFeed.offer_lost_announcements``).
ANNOUNCEMENT_REOFFER_SECS = 600
ANNOUNCEMENT_REOFFER_MAX_SECS = 6 * 3600
# Cold entries kept at most (the oldest refusal makes room): about 1.4 KB each with its index
# entries, so a relay that feeds us refusable events cannot grow memory or the saved file
# without bound. Forgetting one costs a fetch (refused again), never an event.
REJECTED_MAX_ENTRIES = 50_000
# A cold entry's size is bounded too (the count alone let 64 KiB tags make the index
# gigabytes): a tag value or release key longer than this is not kept (an entry whose
# filter tags were dropped may match any filter: stored loose, never lost), and all entries
# together keep under REJECTED_MAX_BYTES (the oldest refusal makes room).
REJECTED_MAX_VALUE_CHARS = 512
REJECTED_MAX_BYTES = 32 * 1024 * 1024
# Release keys kept per refused event (what it may be waiting for: a maintainer listing, a
# repository, a referenced event): enough for any real NIP-34 event, and a hostile one
# cannot make its entry large.
MAX_DEPENDENCIES = 8

# -- hostile input (SPEC §6) -------------------------------------------------------------
MAX_MESSAGE_BYTES = 1024 * 1024
# A websocket message this large ends the connection (one larger than MAX_MESSAGE_BYTES is
# only dropped and counted): past it, a peer is streaming junk into our memory.
MAX_FRAME_BYTES = 4 * MAX_MESSAGE_BYTES
# A relay whose read limit a message of ours passed ends the session: with close status 1009
# ("message too big") or without a word. Ended so within this long of our sending a message
# of LONG_MESSAGE_BYTES or more (with 1009, or twice in a row without), it is read as that:
# messages are kept to half the longest from then on (never below MIN_LEARNED_MESSAGE_BYTES),
# for the relay's life in this process. A relay that publishes max_message_length is never sent longer ones.
LONG_MESSAGE_BYTES = 16 * 1024
HANGUP_AFTER_LONG_SECS = 5.0
MIN_LEARNED_MESSAGE_BYTES = 8 * 1024
JUNK_DISCONNECT_THRESHOLD = 50  # malformed frames in a row before we hang up
# Pings and pongs with no message between them: a relay pings every half minute or so, a
# stream of them is a flood (it ends the connection as a broken frame would). Counted per
# CONTROL_FLOOD_WINDOW_SECS, so that an idle relay pinging for hours is not taken for one.
CONTROL_FLOOD_FRAMES = 1_000
CONTROL_FLOOD_WINDOW_SECS = 10.0
# "A relay that keeps misbehaving" (SPEC §6), as a rule: every relay session has a budget of
# misbehaviour points, refilled over time. Each frame or event gsync drops costs one (junk,
# forged, oversized, off-filter, on a subscription we never opened, NIP-77 frames for no
# exchange of ours) and so does each NOTICE (log lines). Overdrawn, gsync hangs up and the
# relay backs off as after a failed connection, however long the session had lasted. An
# honest relay costs a handful (a stray event after CLOSE, a filter field it ignores); a
# hostile one thousands a second. What a relay can make us do is then bounded: at most
# BUDGET + REFILL x seconds drops per session (each at most one signature check), and every
# exhausted session doubles its backoff. JUNK_DISCONNECT_THRESHOLD still ends a pure junk
# stream sooner.
MISBEHAVIOUR_BUDGET = 1_000
MISBEHAVIOUR_REFILL_PER_SEC = 10.0
# A websocket message begun must be finished within this much time spent reading. Relays send
# messages of a few hundred KiB at most; a peer that stops half-way through a frame, or
# trickles it byte by byte under the idle timeout, would hold the session and up to
# MAX_FRAME_BYTES of our memory for nothing. 30 s carries a full 1 MiB message at 35 KB/s.
MESSAGE_STALL_SECS = 30.0
READ_IDLE_TIMEOUT_SECS = 120.0  # nothing at all from a relay (our pings get pongs every 30 s)
# One NIP-77 exchange may report at most this many ids we lack; past it, it fails
# ("too-many-ids") and the filter is fetched by REQ pages instead, whose memory the delivery
# backlog bounds. Relays refuse NEG-OPEN past about this many items themselves (LocalRelay:
# 50,000), and a relay streaming fresh ids each round could otherwise fill our memory until
# the deadline. About 10 MB at the cap.
NEGENTROPY_MAX_NEED_IDS = 50_000
MAX_RELAYS_PER_ANNOUNCEMENT = 16
MAX_RELAYS_TOTAL = 500  # [network] max_relays

# Delivery backlog (events received, not yet answered by the own relay; INI
# sync.delivery_max_backlog). Relay connections stop reading at the limit (their sockets
# then push back on the relays) and read again below 90 % of it; historic starts wait while
# it is above a quarter of it. Each connection may have one read burst (256 KiB, a few
# hundred events) in hand when the limit is reached, so an event is dropped for backlog
# only past twice the limit plus DELIVERY_BACKLOG_SLACK: a safety net, not a path.
# 20,000 events (about 50 MB held) is over ten seconds of what an own relay stores (LMDB
# LocalRelay: ~1,500 events/s): a larger backlog does not sync faster, it only holds memory
# (200,000 made a 100,000-event sync peak near 1 GB, bench/scale).
DELIVERY_MAX_BACKLOG = 20_000
DELIVERY_HIGH_WATER_FRACTION = 0.25
DELIVERY_BACKLOG_SLACK = 10_000
# A delivery refused with ``error:``, an unknown prefix or none (not final by NIP-01's words)
# is tried this many times, spaced from DELIVERY_RETRY_BASE_SECS by 4x up to
# DELIVERY_RETRY_MAX_SECS (about an hour in all: sync.delivery_retry), then given up as a
# refusal. While it waits for its next attempt it is not part of the backlog that holds
# historic sync.
DELIVERY_MAX_ATTEMPTS = 10
DELIVERY_RETRY_BASE_SECS = 0.5
DELIVERY_RETRY_MAX_SECS = 1200.0
# While the backlog is full, a relay with fewer events than this waiting in it still reads
# (delivery takes sources in turn): one relay's flood must not stop another's live events.
# 500 relays at once would add 25,000 events, inside the hard limit's headroom.
DELIVERY_SOURCE_ALLOWANCE = 50

# -- state_dir (SPEC §5, "What survives a restart") ----------------------------------------
# What changed (rejected entries, relay memories, confirmed items) is written this often,
# in one transaction from the manager's maintenance tick, and at stop. A kill loses at
# most this much: a rejected entry fetched again, a relay memory slightly older, items
# confirmed in it synced again. (Every 10 s, the saves were a ninth of the manager's work
# in a simulated year of relays coming and going, most of them rewriting a relay record.)
STATE_SAVE_SECS = 30.0
# ... while messages come. On ticks alone (nothing but time has passed) at most this often:
# what only time changes (a failure streak over, a cooldown ended) is re-derived after a
# restart anyway, and the time of the save (when the relays it says connected were) may be
# this much older: a quick reconnect asks that much more again. An idle gsync does not
# rewrite its database every 30 s.
STATE_QUIET_SAVE_SECS = 60.0

# -- test-only timers ----------------------------------------------------------------------
# End-to-end tests cannot wait a 24 h policy probe or a 65 s cooldown. The environment
# variable GSYNC_TEST_TIMERS ("NAME=seconds,NAME=seconds") replaces the timers named in
# TEST_TIMER_NAMES, and only those, when the process starts; GSYNC_TEST_TIME_SCALE (a factor)
# multiplies all of them first. Both are for tests only: they are read nowhere else, are not
# INI keys, and gsync logs ``test_timers_active`` at start whenever either is set. (The seed
# has the same idea: sub-second backoffs under its test mode.) Overlaps such as the 900 s of
# ``since`` are not timers: they are compared with events' created_at and never change.
# The two prices of a start (START_BYTES, WAIT_BYTES_PER_SEC) go with them: the suite's worlds
# of a few events, under its 20 ms gate, exercise NIP-77 at a price of 0 (starts free), as
# they exercise 24 h timers at a second; tests of the method choice keep the real prices.
TEST_TIMER_NAMES = (
    "CONSOLIDATION_MIN_SECS", "PURGATORY_TTL_SECS", "POLL_SECS", "POLL_SECS_PER_KIB", "POLL_MAX_SECS",
    "LIVE_AUDIT_SECS",
    "FRESH_POLL_SECS",
    "POLL_DEFER_SECS", "NEGENTROPY_DEADLINE_SECS",
    "FOLLOWER_WAIT_MAX_SECS",
    "REQ_STALL_SECS", "REQ_LIFETIME_SECS", "NEGENTROPY_GRACE_SECS", "NEGENTROPY_QUEUE_SECS",
    "QUICK_RECONNECT_SECS", "DAILY_MIN_SECS", "DAILY_MAX_SECS", "RECOVERY_BASE_SECS",
    "RECOVERY_MAX_SECS", "DEAD_AFTER_SECS", "DEAD_RETRY_SECS", "PERMANENT_FAILURE_PARK_SECS", "STABILITY_SECS",
    "PROVEN_SESSION_SECS",
    "RATE_LIMIT_COOLDOWN_SECS", "RATE_LIMIT_COOLDOWN_MAX_SECS", "REACTIVE_GATE_START_SECS", "REACTIVE_GATE_MAX_SECS",
    "POLICY_PROBE_SECS", "NIP77_RETRY_SECS", "MAINTENANCE_TICK_SECS", "HANDSHAKE_TIMEOUT_SECS", "DESCENDANT_TICK_SECS",
    "REJECTED_HOT_SECS", "REJECTED_COLD_SECS", "STORE_PROBE_FIRST_SECS", "STORE_PROBE_MAX_SECS",
    "RELEASE_BEHIND_OTHERS_SECS",
    "ANNOUNCEMENT_REOFFER_SECS", "ANNOUNCEMENT_REOFFER_MAX_SECS",
    "TIME_CUT_SUSPECT_SECS", "MESSAGE_STALL_SECS",
    "READ_IDLE_TIMEOUT_SECS", "SELF_REREAD_SECS", "SELF_FULL_REREAD_SECS",
    "STATE_SAVE_SECS", "STATE_QUIET_SAVE_SECS", "OWN_IDLE_PING_SECS", "OWN_HISTORY_DEADLINE_SECS",
    "OWN_READ_DEADLINE_SECS", "DELIVERY_RETRY_BASE_SECS", "DELIVERY_RETRY_MAX_SECS", "OWN_READ_WINDOW_SECS",
    "START_BYTES", "WAIT_BYTES_PER_SEC",
)


def _test_timers(environ) -> dict[str, float]:
    """The overrides ``environ`` asks for (empty in production). Malformed text is an error:
    a test that believes it shortened a timer must not silently wait the real one."""
    scale = float(environ.get("GSYNC_TEST_TIME_SCALE", "1") or 1)
    if not 0 < scale <= 1:
        raise ValueError("GSYNC_TEST_TIME_SCALE must be in (0, 1]")
    out = {name: globals()[name] * scale for name in TEST_TIMER_NAMES} if scale != 1 else {}
    for entry in filter(None, (e.strip() for e in environ.get("GSYNC_TEST_TIMERS", "").split(","))):
        name, sep, value = entry.partition("=")
        name = name.strip().upper()
        if not sep or name not in TEST_TIMER_NAMES:
            raise ValueError(f"GSYNC_TEST_TIMERS: unknown timer {name!r} (known: {', '.join(TEST_TIMER_NAMES)})")
        out[name] = float(value)
    return out


def _apply_test_timers() -> dict[str, float]:
    import os

    overrides = _test_timers(os.environ)
    globals().update(overrides)
    return overrides


TEST_TIMERS_ACTIVE = _apply_test_timers()  # {} unless a test asked
