// Java heap workload for `farmem-bench compare --workload jvm-heap`.
//
// Usage: java -XX:+UseG1GC -Xmx... -cp DIR Heap HEAP_BYTES PASSES SEED
//
// The same job as heap.js, on the Java heap: about HEAP_BYTES of live objects, records
// Rec {id, v, w} (three ints: a 24-byte object with compressed oops and class pointers, plus its
// 4-byte slot in a chunk array; 28 bytes each), held in arrays of 65536 records. Record i starts
// with v = f(i), w = g(i) (the same 30-bit hashes as heap.js). Then PASSES passes in order over
// every record, each adding 1 to v (a read-modify-write: the pages are dirty again each pass) and
// summing v mod 2^32. Every record is checked on every pass against values computed from i alone
// (id = i, v = f(i) + pass, w = g(i)), and each pass sum against the sum of those values, so a
// lost, stale or misplaced page fails the run. Prints one JSON line with the phase times; a
// mismatch is an error message on stderr and exit status 3, bad arguments exit status 2.
import java.util.ArrayList;
import java.util.Locale;

public final class Heap {
    static final int RECORD_BYTES = 28;
    static final int CHUNK = 65536;

    static final class Rec {
        final int id;
        int v;
        final int w;

        Rec(int id, int v, int w) {
            this.id = id;
            this.v = v;
            this.w = w;
        }
    }

    static int seedMix;

    static int f(int i) {
        return ((i ^ seedMix) * 0x9e3779b1) >>> 2;
    }

    static int g(int i) {
        return ((i + seedMix) * 0x85ebca6b) >>> 2;
    }

    static void usage(String msg) {
        System.err.println("Heap: " + msg + "\nusage: java Heap HEAP_BYTES PASSES SEED");
        System.exit(2);
    }

    public static void main(String[] args) {
        long heapBytes = 0, passesL = 1, seed = 42;
        try {
            if (args.length < 1) usage("HEAP_BYTES is missing");
            heapBytes = Long.parseLong(args[0]);
            if (args.length > 1) passesL = Long.parseLong(args[1]);
            if (args.length > 2) seed = Long.parseLong(args[2]);
        } catch (NumberFormatException e) {
            usage("arguments must be integers: " + e.getMessage());
        }
        if (heapBytes < 4096) usage("HEAP_BYTES must be an integer >= 4096");
        if (passesL < 1 || passesL > Integer.MAX_VALUE) usage("PASSES must be an integer >= 1");
        if (seed < 0) usage("SEED must be a non-negative integer");
        long nl = heapBytes / RECORD_BYTES;
        if (nl >= Integer.MAX_VALUE) usage("HEAP_BYTES is too large (at most 2^31 - 1 records)");
        int n = (int) nl;
        int passes = (int) passesL;
        seedMix = (int) seed ^ (int) (seed >>> 32);

        long t0 = System.nanoTime();
        ArrayList<Rec[]> chunks = new ArrayList<>();
        for (int start = 0; start < n; start += CHUNK) {
            int len = Math.min(CHUNK, n - start);
            Rec[] chunk = new Rec[len];
            for (int k = 0; k < len; k++) {
                int i = start + k;
                chunk[k] = new Rec(i, f(i), g(i));
            }
            chunks.add(chunk);
        }
        long t1 = System.nanoTime();
        Runtime rt = Runtime.getRuntime();
        long heapUsed = rt.totalMemory() - rt.freeMemory();

        long[] sums = new long[passes];
        long bad = 0;
        String firstBad = null;
        for (int p = 1; p <= passes; p++) {
            int sum = 0, want = 0;
            int i = 0;
            for (Rec[] chunk : chunks) {
                for (int k = 0; k < chunk.length; k++, i++) {
                    Rec r = chunk[k];
                    int v = r.v + 1;
                    r.v = v;
                    sum += v;
                    int wv = f(i) + p;
                    want += wv;
                    if (r.id != i || v != wv || r.w != g(i)) {
                        bad++;
                        if (firstBad == null)
                            firstBad = "pass " + p + ": record " + i + " holds id " + r.id + " v "
                                    + v + " w " + r.w + ", expected id " + i + " v " + wv + " w "
                                    + g(i);
                    }
                }
            }
            if (i != n) {
                bad++;
                if (firstBad == null) firstBad = "pass " + p + ": " + i + " records found, " + n + " built";
            }
            if (sum != want) {
                bad++;
                if (firstBad == null)
                    firstBad = "pass " + p + ": sum " + Integer.toUnsignedString(sum) + ", expected "
                            + Integer.toUnsignedString(want);
            }
            sums[p - 1] = Integer.toUnsignedLong(sum);
        }
        long t2 = System.nanoTime();
        boolean ok = bad == 0;
        StringBuilder s = new StringBuilder();
        for (int p = 0; p < passes; p++) s.append(p == 0 ? "" : ",").append(sums[p]);
        System.out.println(String.format(Locale.ROOT,
                "{\"records\":%d,\"record_bytes\":%d,\"live_bytes\":%d,\"heap_used_bytes\":%d,"
                        + "\"passes\":%d,\"sums\":[%s],\"generate_s\":%.6f,\"passes_s\":%.6f,"
                        + "\"elapsed_s\":%.6f,\"checksum_ok\":%b}",
                n, RECORD_BYTES, (long) n * RECORD_BYTES, heapUsed, passes, s, (t1 - t0) / 1e9,
                (t2 - t1) / 1e9, (t2 - t0) / 1e9, ok));
        System.out.flush();
        if (!ok) {
            System.err.println("Heap: " + bad + " mismatches; first: " + firstBad);
            System.exit(3);
        }
    }
}
