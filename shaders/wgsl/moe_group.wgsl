// Groups a step's expert assignments by expert (a counting sort in one workgroup): expert e's
// assignments, in assignment order, are order[offsets[e]..offsets[e + 1]].
struct Params { assignments: u32, experts: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(2) var<storage, read_write> order: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

const MAX_EXPERTS: u32 = 4096u;
var<workgroup> starts: array<u32, MAX_EXPERTS>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) t: u32) {
    for (var e = t; e < p.experts; e += 256u) {
        var n = 0u;
        for (var a = 0u; a < p.assignments; a++) {
            n += select(0u, 1u, ids[a] == e);
        }
        starts[e] = n;
    }
    workgroupBarrier();
    if (t == 0u) {
        var sum = 0u;
        offsets[0] = 0u;
        for (var e = 0u; e < p.experts; e++) {
            let n = starts[e];
            starts[e] = sum;
            sum += n;
            offsets[e + 1u] = sum;
        }
    }
    workgroupBarrier();
    for (var e = t; e < p.experts; e += 256u) {
        var at = starts[e];
        for (var a = 0u; a < p.assignments; a++) {
            if (ids[a] == e) {
                order[at] = a;
                at++;
            }
        }
    }
}
