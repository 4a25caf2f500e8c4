# One image for every role: the gateway, the dispatcher and the notifier differ only in SERVICES.
# The full node:20 image (not -slim) carries python3, make and g++, which better-sqlite3 needs
# when no prebuilt binary matches.
#
# Stage "web" builds the web application with the dev dependencies (Vite, Preact); the final
# image installs production dependencies only and copies the built app from it.
FROM node:20-bookworm AS web
WORKDIR /build
COPY package.json package-lock.json .npmrc ./
COPY sdk/package.json sdk/
RUN npm ci --ignore-scripts
COPY tsconfig.json ./
COPY web ./web
COPY lib ./lib
COPY scripts/build-web.ts ./scripts/
RUN npx tsx scripts/build-web.ts

FROM node:20-bookworm

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
# here and leaves the app to the COPY from the web stage below.
COPY package.json package-lock.json .npmrc ./
COPY sdk/package.json sdk/
COPY scripts/build-web.ts ./scripts/
RUN npm ci --omit=dev

COPY . .
COPY --from=web /build/web/dist ./web/dist
# DATA_DIR holds SQLite, generated secrets and .eml files in the embedded mode (`docker run`
# without DATABASE_URL); mount a volume there to keep them.
RUN mkdir -p /data && chown node:node /data
VOLUME ["/data"]
USER node

EXPOSE 3000 3030
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
	CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.OPS_PORT || 3030) + '/health').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# The server itself is PID 1, so `docker stop`'s SIGTERM reaches it: npm would not pass it on.
CMD ["node", "--import", "tsx", "server.ts"]
