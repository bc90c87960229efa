// Fills MIB MiB of byte[] blocks held live, then reads them back: a checksum any lost or
// corrupted page of the Java heap would change. Usage: java Fill MIB
public class Fill {
    public static void main(String[] args) {
        int mib = Integer.parseInt(args[0]);
        byte[][] blocks = new byte[mib * 16][];
        for (int i = 0; i < blocks.length; i++) {
            byte[] b = new byte[65536];
            for (int j = 0; j < b.length; j += 512) b[j] = (byte) (i * 31 + j);
            blocks[i] = b;
        }
        long sum = 0;
        for (int i = 0; i < blocks.length; i++)
            for (int j = 0; j < 65536; j += 512) sum = (sum * 31 + blocks[i][j]) % 1000000007L;
        System.out.println("blocks " + blocks.length + " checksum " + sum);
    }
}
