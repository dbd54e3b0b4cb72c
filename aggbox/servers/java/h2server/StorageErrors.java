/* Storage errors of the local server: see AggboxMongoH2Server.java and docs/design.md
 * "The local server". */

import org.h2.mvstore.MVStoreException;

import java.time.Instant;
import java.util.concurrent.atomic.AtomicLong;

/**
 * H2's storage errors (MVStoreException anywhere in the cause chain), met in a request, in the
 * oplog's trimmer or in H2's background writer: each is counted (aggboxOplogStats'
 * storageErrors) and printed as a line starting with "AGGBOX-STORAGE-ERROR", which
 * bench/soak.py looks for in the server's log.
 */
final class StorageErrors {

    static final AtomicLong COUNT = new AtomicLong();

    private StorageErrors() {
    }

    static boolean is(Throwable error) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (t instanceof MVStoreException) {
                return true;
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return false;
    }

    static void report(String where, Throwable error) {
        COUNT.incrementAndGet();
        System.out.println("AGGBOX-STORAGE-ERROR " + Instant.now() + " " + where + ": " + error);
        System.out.flush();
        error.printStackTrace();
    }
}
