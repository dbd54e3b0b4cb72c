/*
 * Runs another Java main class and exits the JVM (System.exit(0), so shutdown hooks run and
 * e.g. a Kafka broker shuts down cleanly) as soon as stdin reaches end of file, i.e. when the
 * Python process that started it closes the pipe or dies. Used by aggbox.servers.kafka so a
 * broker never outlives its test session.
 *
 * Usage: java -cp <classes>:<jars> AggboxStdinGuard <main class> [args...]
 *
 * Compiled once by aggbox.servers.maven.compile_java and cached.
 */

import java.io.IOException;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Arrays;

public final class AggboxStdinGuard {

    private AggboxStdinGuard() {
    }

    public static void main(String[] args) throws Throwable {
        if (args.length < 1) {
            System.err.println("usage: AggboxStdinGuard <main class> [args...]");
            System.exit(2);
        }
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() != -1) {
                    // the parent never writes; EOF means it closed the pipe or died
                }
            } catch (IOException e) {
                // treat as EOF
            }
            System.err.println("AggboxStdinGuard: stdin closed, shutting down");
            System.exit(0);
        }, "aggbox-stdin-guard");
        watcher.setDaemon(true);
        watcher.start();

        Method main = Class.forName(args[0]).getMethod("main", String[].class);
        try {
            main.invoke(null, (Object) Arrays.copyOfRange(args, 1, args.length));
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
    }
}
