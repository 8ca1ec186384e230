// Cross-workgroup message-passing litmus test, the pattern the persistent queue relies on.
// Workgroups take tickets with one atomic counter: ticket 2p writes message p, ticket 2p + 1
// reads it, so a reader only ever waits on a writer that has already started; later tickets
// are stressors that hammer their own block of memory meanwhile.
//
// Writer: all 64 invocations store `words` plain values (in a strided order, to spread the
// stores), `storageBarrier`, then the leader `atomicStore`s the flag to `round + 1`.
// Reader: the leader polls the flag (at most `spin_limit` polls), broadcasts through
// `workgroupUniformLoad`, `storageBarrier`, then every invocation checks every word. A stale
// word (from an earlier round) is a violation. Results: [observed, violations, timeouts].
// Flags and data are never cleared: each round's values differ from the last round's.

struct MpParams {
    pairs: u32,
    words: u32,
    round: u32,
    spin_limit: u32,
}

@group(0) @binding(0) var<uniform> mp: MpParams;
@group(0) @binding(1) var<storage, read_write> data: array<u32>;
@group(0) @binding(2) var<storage, read_write> flags: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> results: array<atomic<u32>>;

var<workgroup> mp_ticket: u32;
var<workgroup> mp_seen: u32;

fn message(pair: u32, word: u32) -> u32 {
    return (mp.round * 0x9e3779b9u) ^ (pair * 0x85ebca6bu) ^ word;
}

// results[3] is the ticket counter; the host zeroes results before each round.
@compute @workgroup_size(64)
fn message_passing(@builtin(local_invocation_index) lid: u32) {
    if lid == 0u {
        mp_ticket = atomicAdd(&results[3], 1u);
    }
    let ticket = workgroupUniformLoad(&mp_ticket);
    let pair = ticket / 2u;
    if pair >= mp.pairs {
        // Stressor: load, bump and store its own block of words while the pairs talk.
        let base = (mp.pairs + ticket - 2u * mp.pairs) * mp.words;
        for (var i = lid; i < mp.words; i += 64u) {
            data[base + i] = data[base + i] + 1u;
        }
        return;
    }
    let base = pair * mp.words;
    if ticket % 2u == 0u {
        for (var i = lid; i < mp.words; i += 64u) {
            // Strided order: word (i * 37) mod words visits every word once when 37 does not
            // divide words; the host picks `words` coprime with 37.
            let w = (i * 37u) % mp.words;
            data[base + w] = message(pair, w);
        }
        storageBarrier();
        if lid == 0u {
            atomicStore(&flags[pair], mp.round + 1u);
        }
        return;
    }
    if lid == 0u {
        var seen = 0u;
        for (var spins = 0u; spins < mp.spin_limit; spins++) {
            if atomicLoad(&flags[pair]) == mp.round + 1u {
                seen = 1u;
                break;
            }
        }
        mp_seen = seen;
    }
    let seen = workgroupUniformLoad(&mp_seen);
    storageBarrier();
    if seen == 0u {
        if lid == 0u {
            atomicAdd(&results[2], 1u);
        }
        return;
    }
    var stale = 0u;
    for (var i = lid; i < mp.words; i += 64u) {
        if data[base + i] != message(pair, i) {
            stale += 1u;
        }
    }
    if stale != 0u {
        atomicAdd(&results[1], stale);
    }
    if lid == 0u {
        atomicAdd(&results[0], 1u);
    }
}
