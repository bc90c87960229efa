// The soak's JVM program (farmem-bench soak): a heap of small arrays rewritten in a seeded
// random order, each checked on every visit; prints a checksum that depends only on the
// arguments, so the harness compares it with a run without farmem.
import java.util.Random;

public class Soak {
    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]);
        int rounds = Integer.parseInt(args[1]);
        long[][] heap = new long[n][];
        for (int i = 0; i < n; i++) {
            heap[i] = new long[32];
            for (int j = 0; j < 32; j++) heap[i][j] = (long) i * 32 + j;
        }
        Random rnd = new Random(7);
        long[] version = new long[n];
        for (int r = 0; r < rounds * n; r++) {
            int i = rnd.nextInt(n);
            long[] a = heap[i];
            for (int j = 0; j < 32; j++) {
                if (a[j] != (long) i * 32 + j + version[i]) {
                    System.out.println("FAIL jvm: array " + i + " word " + j);
                    System.exit(1);
                }
                a[j]++;
            }
            version[i]++;
        }
        long sum = 0;
        for (int i = 0; i < n; i++) for (int j = 0; j < 32; j++) sum = sum * 31 + heap[i][j];
        System.out.println("ok jvm " + n + " checksum " + Long.toHexString(sum));
    }
}
