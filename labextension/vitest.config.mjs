import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    environment: 'happy-dom',
    include: ['test/**/*.test.ts'],
    pool: 'threads',
    poolOptions: { threads: { maxThreads: 2, minThreads: 1 } }
  }
});
