# One image for every role: the gateway, the dispatcher and the notifier differ only in SERVICES.
# It runs on the current Node LTS (24); Node 20, which the development machines still run, reached
# its end of life in April 2026. The full node:24 image (not -slim) carries python3, make and g++,
# which better-sqlite3 needs when no prebuilt binary matches. Its prebuilt binary is the one to
# have: compiled here against Node 24.19 or later, the addon aborts the process in garbage
# collection (nodejs/node#65446; CONTRIBUTING.md, "Running the tests and CI").
#
# Stage "build" compiles the service with tsc (`npm run build`, into dist/) and builds the web
# application, both with the dev dependencies (TypeScript, Vite, Preact). The final image installs
# production dependencies only and copies dist/ and web/dist from it: it holds no TypeScript
# source and runs plain JavaScript, with no compiler at start-up.
FROM node:24-bookworm AS build
WORKDIR /build
COPY package.json package-lock.json .npmrc ./
COPY sdk/package.json sdk/
RUN npm ci --ignore-scripts
COPY tsconfig.json tsconfig.build.json server.ts app.ts moleculer.config.ts ./
COPY lib ./lib
COPY mixins ./mixins
COPY services ./services
COPY migrations ./migrations
COPY scripts ./scripts
COPY web ./web
RUN npm run build && npx tsx scripts/build-web.ts

FROM node:24-bookworm

WORKDIR /app
# HOST: every interface of the container, so that a published port reaches the gateway (outside
# production and the image, the service listens on loopback by default).
ENV NODE_ENV=production \
	HOST=0.0.0.0 \
	PORT=3000 \
	OPS_PORT=3030 \
	DATA_DIR=/data

# Dependencies first, so that a code change does not reinstall them. The SDK is an npm workspace:
# npm ci needs its package.json to link it. `npm ci` runs the prepare script, which finds no Vite
# here and leaves the app to the COPY from the build stage below.
COPY package.json package-lock.json .npmrc ./
COPY sdk/package.json sdk/
COPY scripts/build-web.ts ./scripts/
RUN npm ci --omit=dev

COPY --from=build /build/dist ./dist
COPY --from=build /build/web/dist ./web/dist
# A better-sqlite3 compiled here against Node 24.19+ headers, instead of fetched as its published
# binary, would stop the embedded mode at start-up (lib/sqlite-addon.ts): the build stops instead.
RUN node -e 'const problem = require("./dist/lib/sqlite-addon").sqliteAddonProblem(); if (problem) { console.error(problem); process.exit(1); }'
# DATA_DIR holds SQLite, generated secrets and .eml files in the embedded mode (`docker run`
# without DATABASE_URL); mount a volume there to keep them.
RUN mkdir -p /data && chown node:node /data
VOLUME ["/data"]
USER node

EXPOSE 3000 3030
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
	CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.OPS_PORT || 3030) + '/health').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# The server itself is PID 1, so `docker stop`'s SIGTERM reaches it: npm would not pass it on.
# Operators' scripts are compiled too: `docker compose exec gateway node dist/scripts/token.js --sub alice`.
CMD ["node", "dist/server.js"]
